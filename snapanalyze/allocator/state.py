"""The caching allocator's state machine: pools of free blocks, segments cut into blocks, malloc and free.

Contract: `Allocator(settings, cuda)` starts empty; `place_segments` rebuilds a starting state; `malloc(size,
stream, pool)` returns the Block it hands out or None (out of memory), `free(addr)` returns a block to its
pool, `release_cached()` is `empty_cache()`. Every segment it reserves or returns is appended to `events` as a
SegmentEvent, the order the real allocator records them in. `cuda` decides whether a segment of n bytes can be
had from the driver and at which address (a `Driver`): the replay takes the trace's answers, a what-if the
device's capacity.

Follows c10/cuda/CUDACachingAllocator.cpp (see `settings` for the versions read): free blocks per pool in a
set ordered by (stream, size, address) (`BlockComparatorSize`, the same from 2.0 to today); `get_free_block`
takes the smallest block of the same stream that holds the request, refusing an oversize block (≥
max_split_size) for a request below max_split_size and, for a request at or above it, a block of request +
max_non_split_rounding_size or more; `should_split` (small pool or expandable segments on: a remainder ≥ 512 B;
else a request below max_split_size and a remainder above 1 MiB) gives the front to the request; `free_block`
merges with free neighbours in the same mapping state; `malloc`'s order: free block → garbage collection (a
memory fraction below 1 set) → `alloc_block` (the fraction's admission limit, then cudaMalloc or mapping) →
`release_available_cached_blocks` (max_split_size set) → `release_cached_blocks` (the global pools only; a
graph's private pool only once the trace shows its graph released) → out of memory. `release_blocks` gives
back whole segments in (stream, size, address) order, the large pool before the small one; expandable
segments unmap the whole pages of their free blocks.
Expandable segments (`find_expandable_block`, `map_block`, `unmap_block`): one virtual range of 1.125 × the
device per pool and stream, pages of 2 MiB (small pool) or 20 MiB (large), mapped from the lowest unmapped
range that, with the free block before it, has room. Not modelled: stream-ordered frees' events (a free takes
effect at its `free_completed`), a released graph's pool freed by the OOM path, MemPools' `use_on_oom`/`no_split`,
free-memory callbacks.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from .settings import LARGE_BUFFER, MIN_BLOCK, SIZE_MAX, SMALL_BUFFER, SMALL_SIZE, AllocatorSettings

DEFAULT_POOL = "0,0"


@dataclass(frozen=True)
class SegmentEvent:
    """A segment the allocator reserved (`segment_alloc`, `segment_map`) or returned (`segment_free`,
    `segment_unmap`): the trace's action name, address and bytes."""

    action: str
    addr: int
    size: int


class Segment:
    """A cudaMalloc'd segment, or an expandable segment's virtual range (its pages mapped as blocks need them)."""

    __slots__ = ("addr", "size", "stream", "pool", "small", "expandable")

    def __init__(self, addr: int, size: int, stream: int, pool: str, small: bool, expandable: bool = False) -> None:
        self.addr, self.size, self.stream, self.pool, self.small = addr, size, stream, pool, small
        self.expandable = expandable


class Block:
    __slots__ = ("addr", "size", "requested", "allocated", "mapped", "prev", "next", "segment", "gc_base")

    def __init__(self, segment: Segment, addr: int, size: int, mapped: bool = True) -> None:
        self.segment, self.addr, self.size, self.mapped = segment, addr, size, mapped
        self.requested = 0
        self.allocated = False
        self.prev: Block | None = None
        self.next: Block | None = None
        self.gc_base = 0

    @property
    def whole(self) -> bool:
        """The block is its segment entire (only such a block can be given back to the driver)."""
        return self.prev is None and self.next is None


class SortedKeys:
    """Sorted tuples in sublists of at most LOAD: insert, remove and lower_bound in O(log n + LOAD), so a pool
    of a million free blocks costs what one of a thousand does (a plain sorted list moves every key after
    the insertion point)."""

    LOAD = 512
    __slots__ = ("lists", "maxes", "size")

    def __init__(self) -> None:
        self.lists: list[list[tuple[int, ...]]] = []
        self.maxes: list[tuple[int, ...]] = []
        self.size = 0

    def __len__(self) -> int:
        return self.size

    @classmethod
    def of(cls, keys: list[tuple[int, ...]]) -> SortedKeys:
        out = cls()
        keys.sort()
        out.lists = [keys[i:i + cls.LOAD] for i in range(0, len(keys), cls.LOAD)]
        out.maxes = [sub[-1] for sub in out.lists]
        out.size = len(keys)
        return out

    def add(self, key: tuple[int, ...]) -> None:
        self.size += 1
        if not self.lists:
            self.lists.append([key])
            self.maxes.append(key)
            return
        i = min(bisect.bisect_left(self.maxes, key), len(self.lists) - 1)
        sub = self.lists[i]
        bisect.insort(sub, key)
        self.maxes[i] = sub[-1]
        if len(sub) > 2 * self.LOAD:
            self.lists[i:i + 1] = [sub[:self.LOAD], sub[self.LOAD:]]
            self.maxes[i:i + 1] = [sub[self.LOAD - 1], sub[-1]]

    def discard(self, key: tuple[int, ...]) -> None:
        i = bisect.bisect_left(self.maxes, key)
        sub = self.lists[i]
        del sub[bisect.bisect_left(sub, key)]
        self.size -= 1
        if sub:
            self.maxes[i] = sub[-1]
        else:
            del self.lists[i], self.maxes[i]

    def ceiling(self, key: tuple[int, ...]) -> tuple[int, int] | None:
        """The position (sublist, index) of the first key ≥ `key` (None: there is none)."""
        i = bisect.bisect_left(self.maxes, key)
        if i == len(self.maxes):
            return None
        return i, bisect.bisect_left(self.lists[i], key)

    def following(self, pos: tuple[int, int]) -> tuple[int, int] | None:
        i, j = pos
        if j + 1 < len(self.lists[i]):
            return i, j + 1
        return (i + 1, 0) if i + 1 < len(self.lists) else None

    def preceding(self, pos: tuple[int, int]) -> tuple[int, int] | None:
        i, j = pos
        if j > 0:
            return i, j - 1
        return (i - 1, len(self.lists[i - 1]) - 1) if i > 0 else None

    def at(self, pos: tuple[int, int]) -> tuple[int, ...]:
        return self.lists[pos[0]][pos[1]]

    def last(self) -> tuple[int, int] | None:
        return (len(self.lists) - 1, len(self.lists[-1]) - 1) if self.lists else None

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        for sub in self.lists:
            yield from sub


class Pool:
    """One pool: its free mapped blocks ordered by (stream, size, address) and, for expandable segments, its
    unmapped ranges ordered by (stream, address) (`BlockPool.blocks`, `BlockPool.unmapped`)."""

    __slots__ = ("name", "small", "keys", "blocks", "unmapped", "holes", "calls")

    def __init__(self, name: str, small: bool) -> None:
        self.name, self.small = name, small
        self.keys = SortedKeys()
        self.blocks: dict[int, Block] = {}
        self.unmapped: list[tuple[int, int]] = []
        self.holes: dict[int, Block] = {}
        self.calls = 0                    # get_free_blocks_call_count (garbage collection's clock)

    def insert(self, b: Block) -> None:
        """`insert_into_blocks` (a mapped block) or into `unmapped`."""
        if b.mapped:
            self.keys.add((b.segment.stream, b.size, b.addr))
            self.blocks[b.addr] = b
            b.gc_base = self.calls
        else:
            bisect.insort(self.unmapped, (b.segment.stream, b.addr))
            self.holes[b.addr] = b

    def sort(self) -> None:
        """Order `blocks` once after adding many to it directly (a starting state)."""
        self.keys = SortedKeys.of([(b.segment.stream, b.size, b.addr) for b in self.blocks.values()])

    def remove(self, b: Block) -> None:
        if b.mapped:
            self.keys.discard((b.segment.stream, b.size, b.addr))
            del self.blocks[b.addr]
        else:
            del self.unmapped[bisect.bisect_left(self.unmapped, (b.segment.stream, b.addr))]
            del self.holes[b.addr]

    def at(self, pos: tuple[int, int]) -> Block:
        return self.blocks[self.keys.at(pos)[2]]

    def largest(self) -> int:
        return max((k[1] for k in self.keys), default=0)


class Driver:
    """What the device answers: a new segment of `n` bytes (its address, None: out of memory), pages to map
    (True: mapped), a virtual range for an expandable segment (its address). `total` is the device's memory
    (None: unknown), which a memory fraction and an expandable segment's range are sized from."""

    total: int | None = None

    def reserve(self, n: int, reserved: int) -> int | None:       # pragma: no cover - an interface
        raise NotImplementedError

    def map(self, n: int, reserved: int) -> bool:                 # pragma: no cover - an interface
        raise NotImplementedError

    def address_range(self, n: int) -> int:                       # pragma: no cover - an interface
        raise NotImplementedError

    def released(self, n: int) -> None:
        """`n` bytes were given back."""


class Allocator:
    """One device's caching allocator (see the module docstring)."""

    def __init__(self, settings: AllocatorSettings, driver: Driver) -> None:
        self.settings = settings
        self.driver = driver
        self.pools: dict[tuple[str, bool], Pool] = {}
        self.segments: dict[int, Segment] = {}
        self.allocated: dict[int, Block] = {}
        self.events: list[SegmentEvent] = []
        self.reserved = 0                 # Σ cudaMalloc'd segments + mapped pages (total_allocated_memory)
        self.allocated_bytes = 0          # Σ block sizes handed out
        self.requested_bytes = 0          # Σ bytes asked for

    # -- pools and the starting state ----------------------------------------------------------------------

    def pool(self, name: str, small: bool) -> Pool:
        p = self.pools.get((name, small))
        if p is None:
            p = self.pools[(name, small)] = Pool(name, small)
        return p

    def _pool_of(self, b: Block) -> Pool:
        return self.pool(b.segment.pool, b.segment.small)

    def place_segments(self, segments: Sequence[tuple[int, int, int, str, bool, bool]], first: Sequence[int],
                       blocks: tuple[Sequence[int], Sequence[int], Sequence[int]]) -> None:
        """The segments that exist at the start, each (addr, size, stream, pool, small, expandable), segment j cut
        into the blocks `first[j]` to `first[j + 1]` of `blocks` (columns offset, size, requested bytes; 0
        requested: free), which tile it in offset order (none: one free block); each pool is sorted once. An
        expandable segment is taken as mapped from `addr` to `addr + size`, with no range beyond."""
        offsets, sizes, requests = blocks
        for j, (addr, size, stream, pool, small, expandable) in enumerate(segments):
            seg = self.segments[addr] = Segment(addr, size, stream, pool, small, expandable)
            self.reserved += size
            free = self.pool(pool, small).blocks
            lo, hi = first[j], first[j + 1]
            if lo == hi:
                free[addr] = Block(seg, addr, size)
                continue
            prev: Block | None = None
            for k in range(lo, hi):
                b = Block(seg, addr + offsets[k], sizes[k])
                if prev is not None:
                    b.prev, prev.next = prev, b
                prev = b
                if requests[k]:
                    self._hand_out(b, requests[k])
                else:
                    free[b.addr] = b
        for p in self.pools.values():
            p.sort()

    def segment_blocks(self, seg: Segment) -> list[Block]:
        """A segment's blocks in address order: handed out, free and (an expandable segment's) unmapped."""
        p = self.pool(seg.pool, seg.small)
        b = self.allocated.get(seg.addr) or p.blocks.get(seg.addr) or p.holes.get(seg.addr)
        out = []
        while b is not None:
            out.append(b)
            b = b.next
        return out

    # -- malloc ----------------------------------------------------------------------------------------------

    def malloc(self, requested: int, stream: int, pool: str = DEFAULT_POOL) -> Block | None:
        """Serve `requested` bytes on `stream` from `pool`, as `DeviceCachingAllocator::malloc` (None: OOM)."""
        s = self.settings
        size = s.round_size(requested)
        p = self.pool(pool, size <= SMALL_SIZE)
        block = self._free_block(p, stream, size)
        if block is None:
            if s.garbage_collection_threshold > 0 and self._allowed() is not None:
                self._garbage_collect()
            block = (self._new_block(p, stream, size)
                     or (self._release_available(p, stream, size) and self._new_block(p, stream, size))
                     or (self._release_all() and self._new_block(p, stream, size))
                     or None)
        if block is None:
            return None
        if self._should_split(block, size):
            self._split(block, size, p)
        self._hand_out(block, requested)
        return block

    def fits_cached(self, requested: int, stream: int, pool: str = DEFAULT_POOL) -> bool:
        """Whether a cached free block would serve this request (nothing changes)."""
        size = self.settings.round_size(requested)
        p = self.pools.get((pool, size <= SMALL_SIZE))
        return p is not None and self._candidate(p, stream, size) is not None

    def _candidate(self, p: Pool, stream: int, size: int) -> Block | None:
        """`get_free_block`'s choice (see the module docstring), without taking it."""
        keys = p.keys
        pos = keys.ceiling((stream, size, -1))
        if pos is None or keys.at(pos)[0] != stream:
            return None
        b = p.at(pos)
        if b.segment.expandable:
            if self.settings.expandable_segments:       # prefer a block whose unmapped tail is not wasted
                nxt = keys.following(pos)
                while b.segment.expandable and nxt is not None and keys.at(nxt)[0] == stream \
                        and _expandable_size(p.at(nxt)) < _expandable_size(b):
                    b = p.at(nxt)
                    nxt = keys.following(nxt)
            else:                                       # expandable segments turned off: skip their blocks
                while b.segment.expandable:
                    nxt = keys.following(pos)
                    if nxt is None or keys.at(nxt)[0] != stream:
                        return None
                    pos, b = nxt, p.at(nxt)
        split = self.settings.max_split_size
        if size < split <= b.size:
            return None                                 # an oversize block is kept for oversize requests
        if size >= split and b.size >= size + self.settings.max_non_split_rounding_size:
            return None
        return b

    def _free_block(self, p: Pool, stream: int, size: int) -> Block | None:
        if self.settings.garbage_collection_threshold > 0 and self._allowed() is not None:
            p.calls += 1
        b = self._candidate(p, stream, size)
        if b is not None:
            p.remove(b)
        return b

    def _should_split(self, b: Block, size: int) -> bool:
        remaining = b.size - size
        if b.segment.small or self.settings.expandable_segments:
            return remaining >= MIN_BLOCK
        return size < self.settings.max_split_size and remaining > SMALL_SIZE

    @staticmethod
    def _split(b: Block, size: int, p: Pool, mapped: bool = True) -> Block:
        """Cut `b` (not in its pool) at `size`: the tail (mapped or not) goes back to the pool; returns it."""
        tail = Block(b.segment, b.addr + size, b.size - size, mapped)
        tail.prev, tail.next = b, b.next
        if b.next is not None:
            b.next.prev = tail
        b.next = tail
        b.size = size
        p.insert(tail)
        return tail

    def _hand_out(self, b: Block, requested: int) -> None:
        b.allocated = True
        b.requested = requested
        self.allocated[b.addr] = b
        self.allocated_bytes += b.size
        self.requested_bytes += requested

    def _allowed(self) -> int | None:
        """The memory fraction's limit in bytes (None: no fraction set, or the device's size unknown)."""
        f, total = self.settings.memory_fraction, self.driver.total
        return None if f is None or f >= 1.0 or total is None else int(f * total)

    def _new_block(self, p: Pool, stream: int, size: int) -> Block | None:
        """`alloc_block`: a new segment (expandable: pages mapped) holding `size`; None when refused."""
        alloc = self.settings.allocation_size(size)
        allowed = self._allowed()
        if allowed is not None and self.reserved + alloc > allowed:
            return None                                 # the admission limit: no cudaMalloc is tried
        if self.settings.expandable_segments:
            return self._expandable_block(p, stream, size)
        addr = self.driver.reserve(alloc, self.reserved)
        if addr is None:
            return None
        seg = Segment(addr, alloc, stream, p.name, p.small)
        self.segments[addr] = seg
        self.reserved += alloc
        self.events.append(SegmentEvent("segment_alloc", addr, alloc))
        return Block(seg, addr, alloc)

    # -- free ------------------------------------------------------------------------------------------------

    def free(self, addr: int) -> Block | None:
        """`free_block`: return the block at `addr` to its pool, merged with free neighbours (None: no such block)."""
        b = self.allocated.pop(addr, None)
        if b is None:
            return None
        b.allocated = False
        self.allocated_bytes -= b.size
        self.requested_bytes -= b.requested
        b.requested = 0
        p = self._pool_of(b)
        self._merge(b, b.prev, p)
        self._merge(b, b.next, p)
        p.insert(b)
        return b

    @staticmethod
    def _merge(dst: Block, src: Block | None, p: Pool) -> None:
        """`try_merge_blocks`: absorb a free neighbour in the same mapping state."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return
        p.remove(src)
        if src is dst.prev:
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size

    # -- giving memory back ------------------------------------------------------------------------------------

    def release_cached(self, freeable: Sequence[str] = ()) -> None:
        """`empty_cache()` and the OOM path's `release_cached_blocks`: the global large pool, then the small one,
        then each private pool of `freeable` (those whose graphs were released), its small pool first."""
        self._release_all(freeable)

    def _release_all(self, freeable: Sequence[str] = ()) -> bool:
        for small in (False, True):
            p = self.pools.get((DEFAULT_POOL, small))
            if p is not None:
                self._release_blocks(p)
        for name in freeable:
            for small in (True, False):
                p = self.pools.get((name, small))
                if p is not None:
                    self._release_blocks(p)
        return True

    def pool_at(self, addr: int) -> str | None:
        """The pool of the segment starting at `addr` (None: no such segment)."""
        seg = self.segments.get(addr)
        return None if seg is None else seg.pool

    def _release_blocks(self, p: Pool) -> None:
        """`release_blocks`: whole cudaMalloc segments go back in (stream, size, address) order; then the free
        blocks of expandable segments give back the pages they cover entirely."""
        to_unmap = []
        for key in list(p.keys):
            b = p.blocks[key[2]]
            if b.segment.expandable:
                to_unmap.append(b)
            elif b.whole:
                self._release(b, p)
        for b in to_unmap:
            self._unmap(b, p)

    def _release(self, b: Block, p: Pool) -> None:
        p.remove(b)
        seg = b.segment
        del self.segments[seg.addr]
        self.reserved -= seg.size
        self.driver.released(seg.size)
        self.events.append(SegmentEvent("segment_free", seg.addr, seg.size))

    def _release_available(self, p: Pool, stream: int, size: int) -> bool:
        """`release_available_cached_blocks` (only with max_split_size): give back the smallest oversize block
        of this pool and stream that holds max(size, max_split_size), else the largest ones below it until
        that much is given back."""
        split = self.settings.max_split_size
        if split == SIZE_MAX:
            return False
        key = max(size, split)
        keys = p.keys
        pos = keys.ceiling((stream, key, -1))
        if pos is not None and keys.at(pos)[0] == stream and not p.at(pos).segment.expandable:
            self._release(p.at(pos), p)
            return True
        released = 0
        here = keys.preceding(pos) if pos is not None else keys.last()
        while here is not None and released < key:
            k = keys.at(here)
            if k[1] < split or k[0] != stream:
                break
            b = p.blocks[k[2]]
            here = keys.preceding(here)
            if b.whole and not b.segment.expandable:
                released += b.size
                self._release(b, p)                     # removing a key before `here` leaves `here` valid
        return released >= key

    def _garbage_collect(self) -> None:
        """`garbage_collect_cached_blocks`: over threshold × the fraction's limit, give back whole large-pool
        blocks at least as old as their mean age (age: free-block searches on the pool since cached), in
        passes over the pool, until the excess is given back."""
        allowed = self._allowed()
        p = self.pools.get((DEFAULT_POOL, False))
        if allowed is None or p is None:
            return
        threshold = int(self.settings.garbage_collection_threshold * allowed)
        if self.reserved <= threshold:
            return
        target = self.reserved - threshold
        eligible = [b for b in p.blocks.values() if b.whole and not b.segment.expandable]
        count = len(eligible)
        total_age = sum(p.calls - b.gc_base for b in eligible)
        reclaimed, freed = 0, True
        while reclaimed < target and freed and count > 0:
            mean = total_age / count
            freed = False
            for key in list(p.keys):
                b = p.blocks[key[2]]
                age = p.calls - b.gc_base
                if b.whole and not b.segment.expandable and age >= mean:
                    freed = True
                    reclaimed += b.size
                    total_age -= age
                    count -= 1
                    self._release(b, p)

    # -- expandable segments -----------------------------------------------------------------------------------

    def _page(self, p: Pool) -> int:
        return SMALL_BUFFER if p.small else LARGE_BUFFER

    def _expandable_block(self, p: Pool, stream: int, size: int) -> Block | None:
        """`try_allocate_expandable_block`: the lowest unmapped range of this stream with room for `size` (with
        the free block before it), mapped page by page as needed; a new virtual range when none has room."""
        candidate = self._find_expandable(p, stream, size)
        if candidate is None:
            page = self._page(p)
            total = self.driver.total or (1 << 40)
            length = -(-(total + total // 8) // page) * page     # 1.125 × the device, in pages
            base = self.driver.address_range(length)
            seg = Segment(base, length, stream, p.name, p.small, expandable=True)
            self.segments[base] = seg
            candidate = Block(seg, base, length, mapped=False)
            p.insert(candidate)
        if not candidate.mapped:
            candidate = self._map(candidate, min(candidate.size, size), p)
            if candidate is None:
                return None
        while candidate.size < size:
            nxt = candidate.next
            assert nxt is not None and not nxt.mapped
            candidate = self._map(nxt, min(size - candidate.size, nxt.size), p)
            if candidate is None:
                return None
        p.remove(candidate)
        return candidate

    def _find_expandable(self, p: Pool, stream: int, size: int) -> Block | None:
        i = bisect.bisect_left(p.unmapped, (stream, -1))
        while i < len(p.unmapped) and p.unmapped[i][0] == stream:
            c = p.holes[p.unmapped[i][1]]
            if c.prev is not None and not c.prev.allocated:
                c = c.prev
            room, walk = 0, c  # type: int, Block | None
            while walk is not None and not walk.allocated and room < size:
                room += walk.size
                walk = walk.next
            if room >= size:
                return c
            i += 1
        return None

    def _map(self, b: Block, size: int, p: Pool) -> Block | None:
        """`map_block`: map whole pages from the start of unmapped `b`; the mapped part merges with free
        neighbours and joins the pool. Returns the merged block (None: the device refused)."""
        page = self._page(p)
        mapped = min(-(-size // page) * page, b.size)
        if not self.driver.map(mapped, self.reserved):
            return None
        p.remove(b)
        if mapped < b.size:
            self._split(b, mapped, p, mapped=False)
        b.mapped = True
        self.reserved += mapped
        self.events.append(SegmentEvent("segment_map", b.addr, mapped))
        self._merge(b, b.prev, p)
        self._merge(b, b.next, p)
        p.insert(b)
        return b

    def _unmap(self, b: Block, p: Pool) -> None:
        """`unmap_block`: unmap the whole pages free block `b` covers; the parts before and after stay mapped
        and free. An expandable segment left with nothing mapped gives back its range (no trace entry)."""
        page = self._page(p)
        base = b.segment.addr
        first = base + -(-(b.addr - base) // page) * page
        last = base + (b.addr + b.size - base) // page * page
        if first >= last:
            return
        p.remove(b)
        pieces = []
        if first > b.addr:
            pieces.append(Block(b.segment, b.addr, first - b.addr))
        middle = Block(b.segment, first, last - first, mapped=False)
        pieces.append(middle)
        if b.addr + b.size > last:
            pieces.append(Block(b.segment, last, b.addr + b.size - last))
        before, after = b.prev, b.next
        for left, right in zip([before, *pieces], [*pieces, after]):
            if left is not None:
                left.next = right
            if right is not None:
                right.prev = left
        for piece in pieces:
            if piece is not middle:
                p.insert(piece)
        self.reserved -= middle.size
        self.driver.released(middle.size)
        self.events.append(SegmentEvent("segment_unmap", middle.addr, middle.size))
        self._merge(middle, middle.prev, p)
        self._merge(middle, middle.next, p)
        if middle.whole:
            del self.segments[middle.segment.addr]
        else:
            p.insert(middle)


def _expandable_size(b: Block) -> int:
    """A free block's size with the unmapped range after it (which mapping could add)."""
    nxt = b.next
    return b.size + (nxt.size if nxt is not None and not nxt.mapped else 0)
