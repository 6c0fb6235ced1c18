"""Drive the allocator simulator over one device's trace: check it against what the trace recorded (replay),
or predict what other settings would have done with the same requests (what-if).

Contract: `replay_device(snapshot, timeline, device, settings=None)` → DeviceReplay: how far a simulation
under the recorded settings reproduces the trace — every segment event (`segment_alloc/free/map/unmap`) in
order and every block's address, the reserved curve equal after every event — and the first divergence,
where it stops. `whatif_device(snapshot, timeline, device, settings, capacity)` → DeviceWhatIf: the same
requests under `settings` (and under the recorded ones, with the same capacity, as its baseline): the reserved
peak, the reserved-but-unallocated bytes and largest free block at it, each recorded OOM served or not, valid
up to the first instant where the program would have behaved differently (`valid_until`).

The simulation starts from the state at the window's start (`segment_map` at −1: the segments of that moment
and the blocks live then, at their addresses; a large-pool gap of at most 1 MiB after a live block is that
block's unsplit remainder, since a free large-pool block is never that small). Replay takes what only the
device knew from the trace: the address of each new segment (the recorded `segment_alloc`/`segment_map`),
and when cudaMalloc failed (segments given back right before an allocation: the driver refuses until the
simulation has given back as many as the trace shows). Segments given back before anything but an allocation
are `empty_cache()`. A what-if takes the device's capacity instead: given, else what the first OOM proves
(reserved then + the bytes the driver reported free), else unbounded.
The result carries codes, never sentences: `Divergence.kind` is one of DIVERGENCES.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ..allocator.settings import SMALL_BUFFER, SMALL_SIZE, AllocatorSettings, of_snapshot
from ..allocator.state import DEFAULT_POOL, Allocator, Driver, SegmentEvent
from ..gcpause import gc_paused
from ..model import (
    ALLOC,
    FREE_COMPLETED,
    FREE_REQUESTED,
    OOM,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    Snapshot,
)
from ..replay import Timeline
from .segment_map import segment_map

GROW = (SEGMENT_ALLOC, SEGMENT_MAP)
SHRINK = (SEGMENT_FREE, SEGMENT_UNMAP)
SEGMENT_ACTIONS = {SEGMENT_ALLOC: "segment_alloc", SEGMENT_FREE: "segment_free", SEGMENT_MAP: "segment_map",
                   SEGMENT_UNMAP: "segment_unmap"}

# Divergence.kind: what differed at the first event the simulation did not reproduce
DIVERGENCES = (
    "trace_reserved",        # the trace reserved a segment where the simulation reused a cached block
    "simulation_reserved",   # the simulation reserved a segment where the trace reused a cached block
    "segment_differs",       # both reserved or gave back, not the same segments (size, address, order)
    "expandable_switched",   # segment_map/unmap where the settings have no expandable segments, or the reverse
    "address",               # the block went to another address than the simulation chose
    "unknown_free",          # the trace frees an address the simulation holds no block at
    "oom_served",            # the trace ran out of memory where the simulation served the request
    "oom_unserved",          # the simulation could not serve a request the trace served (what-if: capacity)
)


@dataclass(frozen=True)
class Divergence:
    """The first trace event the simulation did not reproduce."""

    index: int                                   # the trace event (of this device)
    kind: str                                    # one of DIVERGENCES
    recorded: tuple[SegmentEvent, ...] = ()      # the trace's segment events at it
    simulated: tuple[SegmentEvent, ...] = ()     # the simulation's
    recorded_addr: int | None = None             # `address`: where the trace put the block
    simulated_addr: int | None = None            # and where the simulation did
    size: int = 0                                # the request's bytes (alloc, oom) or the freed address' block


@dataclass(frozen=True)
class DeviceReplay:
    """How far a simulation under the recorded settings reproduces one device's trace."""

    device: int
    settings: str                    # PYTORCH_ALLOC_CONF form of the settings simulated ("" = defaults)
    events: int                      # trace events
    simulated: int                   # events simulated (all of them, or up to the first divergence)
    segment_events: int              # segment events the trace recorded
    matched: int                     # of them, reproduced in order before the first divergence
    allocations: int                 # allocations the trace recorded
    addresses_matched: int           # of them, at the address the simulation chose, before the first divergence
    reserved_equal: bool             # the reserved curve equal after every simulated event
    start_exact: bool                # the starting state came from the end state (no block changed after)
    first_divergence: Divergence | None
    observed: Prediction             # the simulation's figures up to the first divergence (the trace's own, there)

    @property
    def agrees(self) -> bool:
        return self.first_divergence is None


@dataclass(frozen=True)
class OomOutcome:
    """A request the trace could not serve, under the simulated settings."""

    index: int
    request: int                     # bytes (the allocator's rounded request)
    capacity: int | None             # the bytes PyTorch could reserve then (reserved + the driver's free)
    served: bool
    reserved: int                    # simulated reserved bytes after it (served or not)
    largest_free: int                # the largest free cached block then


@dataclass(frozen=True)
class Prediction:
    """What the simulation predicts for one device under one set of settings, up to `simulated` events."""

    settings: str
    simulated: int                   # events whose outcome it covers (the stopping event's included)
    reserved_peak: int
    peak_index: int                  # the event after which reserved was highest (−1: at the start)
    unallocated_at_peak: int         # reserved − allocated (block bytes) at that peak
    largest_free_at_peak: int
    ooms: tuple[OomOutcome, ...]
    stop: Divergence | None          # where the program would have behaved differently (None: the whole trace)


@dataclass(frozen=True)
class DeviceWhatIf:
    device: int
    capacity: int | None
    capacity_source: str             # "given", "oom" (reserved + free at the first OOM) or "none"
    trace_reserved_peak: int
    baseline: Prediction             # the recorded settings, with the same capacity
    changed: Prediction


class _TraceDriver(Driver):
    """Replay: the device refuses until the simulation has given back as many segments as the trace shows
    before this event, and hands out the addresses the trace recorded."""

    def __init__(self, total: int | None) -> None:
        self.total = total
        self.grow: list[SegmentEvent] = []
        self.refuse = False
        self.frees = self.freed = 0
        self.synthetic = 1 << 62

    def step(self, recorded: Sequence[SegmentEvent], refuse: bool, freed: int = 0) -> None:
        self.refuse, self.freed = refuse, freed
        if recorded or self.grow or self.frees:
            self.grow = [e for e in recorded if e.action in ("segment_alloc", "segment_map")]
            self.frees = sum(e.action in ("segment_free", "segment_unmap") for e in recorded)

    def _refused(self) -> bool:
        return self.refuse or self.freed < self.frees

    def reserve(self, n: int, reserved: int) -> int | None:
        if self._refused():
            return None
        for k, e in enumerate(self.grow):
            if e.action == "segment_alloc" and e.size == n:
                del self.grow[k]
                return e.addr
        return self._synthetic(n)

    def map(self, n: int, reserved: int) -> bool:
        return not self._refused()

    def address_range(self, n: int) -> int:
        for e in self.grow:                              # a new range's first pages are mapped at its start
            if e.action == "segment_map":
                return e.addr
        return self._synthetic(n)

    def released(self, n: int) -> None:
        self.freed += 1

    def _synthetic(self, n: int) -> int:
        addr = self.synthetic
        self.synthetic += -(-n // SMALL_BUFFER) * SMALL_BUFFER + (1 << 30)
        return addr


class _CapacityDriver(Driver):
    """What-if: the device serves while reserved + n fits `capacity` (None: always), at fresh addresses."""

    def __init__(self, capacity: int | None, total: int | None) -> None:
        self.capacity = capacity
        self.total = total
        self.next = 1 << 62

    def _fits(self, n: int, reserved: int) -> bool:
        return self.capacity is None or reserved + n <= self.capacity

    def reserve(self, n: int, reserved: int) -> int | None:
        return self.address_range(n) if self._fits(n, reserved) else None

    def map(self, n: int, reserved: int) -> bool:
        return self._fits(n, reserved)

    def address_range(self, n: int) -> int:
        addr = self.next
        self.next += -(-n // SMALL_BUFFER) * SMALL_BUFFER + SMALL_BUFFER
        return addr


@dataclass(frozen=True, eq=False)
class StartState:
    """One device's segments at the window's start, each (address, size, stream, pool, small, expandable),
    segment j cut into the blocks `first[j]` to `first[j + 1]` of `blocks` (columns offset, size, requested;
    0: free), and whether the snapshot pins that state down exactly (no block changed after it)."""

    segments: tuple[tuple[int, int, int, str, bool, bool], ...]
    first: tuple[int, ...]
    blocks: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
    exact: bool


def start_state(snapshot: Snapshot, timeline: Timeline, device: int) -> StartState:
    """The state at the window's start (see the module docstring). Columnar: a large-pool gap of at most
    1 MiB right after a live block (and any such gap right after it) joins that block."""
    m = segment_map(snapshot, timeline, device, -1)
    cols = snapshot.segment_columns
    on = cols["device"] == device
    segs = m.segments
    addr = segs["address"].to_numpy(dtype=np.uint64)
    expandable = np.isin(addr, cols["address"][on & cols["is_expandable"].astype(bool)].astype(np.uint64))
    small = segs["segment_type"].astype(str).to_numpy() == "small"
    pieces = m.pieces
    by_addr = np.argsort(addr, kind="stable")
    owner_addr = pieces["segment_address"].to_numpy(dtype=np.uint64)
    at = np.minimum(np.searchsorted(addr[by_addr], owner_addr), max(len(addr) - 1, 0))
    known = addr[by_addr][at] == owner_addr if len(addr) else np.zeros(len(owner_addr), dtype=bool)
    row = by_addr[at][known]                              # each piece's segment (pieces of no segment dropped)
    order = np.argsort(row, kind="stable")                # by segment, each segment's in the map's order
    row = row[order]
    offset, size, requested = (pieces[c].to_numpy(dtype=np.int64)[known][order]
                               for c in ("offset", "size", "requested"))
    live = (pieces["state"].astype(str).to_numpy() != "inactive")[known][order]
    # a free large-pool block is never ≤ 1 MiB: such a gap right after a live block is its unsplit remainder
    # (small pools and expandable segments split any remainder)
    joins = ~live & (size <= SMALL_SIZE) & ~(small | expandable)[row]      # could be such a remainder
    same = np.zeros(len(row), dtype=bool)                                   # the piece before is in its segment
    same[1:] = row[1:] == row[:-1]
    # runs of such pieces in one segment: a run joins the block before it when that block is live
    run_start = joins & ~(np.concatenate(([False], joins[:-1])) & same)
    after_live = same & np.concatenate(([False], live[:-1]))
    run = np.maximum(np.cumsum(run_start) - 1, 0)                          # each piece's run (for `joins` ones)
    joined = joins & after_live[np.flatnonzero(run_start)][run] if run_start.any() else np.zeros(len(row), bool)
    keep = np.flatnonzero(~joined)
    sizes = np.add.reduceat(size, keep) if len(keep) else size[keep]
    first = np.searchsorted(row[keep], np.arange(len(addr) + 1))
    return StartState(
        segments=tuple(zip(addr.tolist(), segs["size"].to_numpy(dtype=np.int64).tolist(),
                           segs["stream"].to_numpy(dtype=np.int64).tolist(), segs["pool"].astype(str).tolist(),
                           small.tolist(), expandable.tolist())),
        first=tuple(first.tolist()),
        blocks=(tuple(offset[keep].tolist()), tuple(sizes.tolist()),
                tuple(np.where(live, np.maximum(requested, 1), 0)[keep].tolist())),
        exact=bool(m.exact))


def _start(start: StartState, settings: AllocatorSettings, driver: Driver) -> Allocator:
    alloc = Allocator(settings, driver)
    alloc.place_segments(start.segments, start.first, start.blocks)
    return alloc


def _recorded(t: object, indices: Sequence[int]) -> list[SegmentEvent]:
    return [SegmentEvent(SEGMENT_ACTIONS[int(t.action[i])], int(t.addr[i]), int(t.size[i]))  # type: ignore[attr-defined]
            for i in indices]


CHUNK = 1 << 16                                          # events turned into Python values at a time


def _events(snapshot: Snapshot, timeline: Timeline, device: int, free_action: int
            ) -> Iterator[tuple[int, int, int, int, int, str, int]]:
    """What a simulation reads of one device's trace, oldest first: (index, action, addr, size, stream, pool,
    reserved after it) of each allocation, OOM, free that takes effect (`free_action`) and segment event, and
    of any other event right after a segment event (where segments given back before it end: empty_cache()).
    The pool is the one the event names (torch ≥ 2.12), else the private pool whose segment (end state)
    holds the address, else the default pool. Columns become Python values a chunk at a time."""
    t = snapshot.trace(device)
    action = t.action
    segment = np.isin(action, (*GROW, *SHRINK))
    after_segment = np.zeros_like(segment)
    after_segment[1:] = segment[:-1]
    keep = np.flatnonzero(np.isin(action, (ALLOC, OOM, free_action)) | segment | after_segment)
    names, codes = _pool_codes(snapshot, device, keep)
    reserved = timeline[device].reserved
    for lo in range(0, len(keep), CHUNK):
        sel = keep[lo:lo + CHUNK]
        yield from zip(sel.tolist(), action[sel].tolist(), t.addr[sel].tolist(), t.size[sel].tolist(),
                       t.stream[sel].tolist(), [names[c] for c in codes[lo:lo + CHUNK].tolist()],
                       reserved[sel].tolist())


def _pool_codes(snapshot: Snapshot, device: int, indices: np.ndarray) -> tuple[list[str], np.ndarray]:
    """The pool of each event `indices` (see `_events`), as codes into a list of pool names."""
    t = snapshot.trace(device)
    segs = snapshot.segment_columns
    on = (segs["device"] == device) & (segs["pool_id"].astype(str) != DEFAULT_POOL)
    starts = segs["address"][on].astype(np.uint64)
    order = np.argsort(starts, kind="stable")
    starts = starts[order]
    ends = starts + segs["total_size"][on].astype(np.uint64)[order]
    span_pools = segs["pool_id"][on].astype(str)[order].tolist()
    names = [DEFAULT_POOL, *span_pools]
    addr = t.addr[indices].astype(np.uint64)
    k = np.searchsorted(starts, addr, side="right") - 1
    inside = (k >= 0) & (addr < ends[np.maximum(k, 0)]) if len(starts) else np.zeros(len(addr), dtype=bool)
    codes = np.where(inside, k + 1, 0)
    named = t.pools_of(indices) if len(indices) else None
    if named is not None:
        given = (named != "").astype(bool)
        labels, inverse = np.unique(named[given].astype(str), return_inverse=True)
        codes[given] = len(names) + inverse
        names += labels.tolist()
    return names, codes


@gc_paused()
def replay_device(snapshot: Snapshot, timeline: Timeline, device: int,
                  settings: AllocatorSettings | None = None, start: StartState | None = None) -> DeviceReplay:
    """Replay mode (see the module docstring); `start`: the device's `start_state`, when already made."""
    s = settings if settings is not None else of_snapshot(snapshot.allocator_settings)
    t = snapshot.trace(device)
    dt = timeline[device]
    driver = _TraceDriver(None)
    start = start if start is not None else start_state(snapshot, timeline, device)
    alloc, exact = _start(start, s, driver), start.exact
    action = t.action
    free_action = FREE_COMPLETED if bool((action == FREE_COMPLETED).any()) else FREE_REQUESTED
    n = len(t)
    segment_events = int(np.isin(action, (*GROW, *SHRINK)).sum())
    allocations = int((action == ALLOC).sum())
    matched = addresses = 0
    reserved_equal = alloc.reserved == dt.reserved_at(-1)
    peak = _Peak(alloc)
    ooms: list[OomOutcome] = []
    device_free = t.device_free
    burst: list[int] = []
    divergence: Divergence | None = None
    for i, a, addr, size, stream, pool, reserved in _events(snapshot, timeline, device, free_action):
        if a in SEGMENT_ACTIONS:
            burst.append(i)
            continue
        if a not in (ALLOC, OOM, free_action) and not burst:
            continue
        recorded = _recorded(t, burst) if burst else []
        burst = []
        before = len(alloc.events)
        kind = None
        placed = None
        gives_back = any(e.action in ("segment_free", "segment_unmap") for e in recorded)
        driver.step(recorded, refuse=a == OOM)
        freeable = _freeable(alloc, recorded) if recorded else []
        if a == ALLOC:
            if gives_back and alloc.fits_cached(size, stream, pool):
                alloc.release_cached(freeable)                   # empty_cache() before this allocation
            block = alloc.malloc(size, stream, pool)
            if block is None:
                kind = "oom_unserved"
            elif block.addr != addr:
                kind, placed = "address", block.addr
        elif a == OOM:
            if alloc.malloc(size, stream, pool) is not None:
                kind = "oom_served"
            else:
                free = device_free.get(i)
                ooms.append(OomOutcome(index=i, request=s.round_size(size), served=False, reserved=alloc.reserved,
                                       capacity=reserved + free if free is not None else None,
                                       largest_free=_largest_free(alloc)))
        elif a == free_action:
            if gives_back:
                alloc.release_cached(freeable)
            if alloc.free(addr) is None:
                kind = "unknown_free"
        else:
            alloc.release_cached(freeable)
        if not recorded and len(alloc.events) == before:      # no segment event, recorded or simulated
            if kind is None:
                addresses += a == ALLOC
                reserved_equal = reserved_equal and alloc.reserved == reserved
            if alloc.reserved > peak.reserved:
                peak.update(alloc, i)
            if kind is not None:
                divergence = Divergence(index=i, kind=kind, recorded_addr=addr if kind == "address" else None,
                                        simulated_addr=placed, size=size)
                break
            continue
        simulated = tuple(alloc.events[before:])
        same = _common_prefix(recorded, simulated)
        matched += same
        if kind is None and same < max(len(recorded), len(simulated)):
            kind = _segment_kind(recorded, simulated)
        if kind is None and a == ALLOC:
            addresses += 1
        if kind is None and alloc.reserved != reserved:
            reserved_equal = False
        if alloc.reserved > peak.reserved:
            peak.update(alloc, i)
        if kind is not None:
            divergence = Divergence(index=i, kind=kind, recorded=tuple(recorded), simulated=simulated,
                                    recorded_addr=addr if kind == "address" else None, simulated_addr=placed,
                                    size=size)
            break
    else:
        if burst:                                        # segments given back after the last event: empty_cache()
            recorded = _recorded(t, burst)
            before = len(alloc.events)
            driver.step(recorded, refuse=False)
            alloc.release_cached(_freeable(alloc, recorded))
            simulated = tuple(alloc.events[before:])
            same = _common_prefix(recorded, simulated)
            matched += same
            if same < max(len(recorded), len(simulated)):
                divergence = Divergence(index=n - 1, kind=_segment_kind(recorded, simulated),
                                        recorded=tuple(recorded), simulated=simulated)
    simulated_events = divergence.index if divergence is not None else n
    return DeviceReplay(device=device, settings=s.conf(), events=n, simulated=simulated_events,
                        segment_events=segment_events, matched=matched, allocations=allocations,
                        addresses_matched=addresses, reserved_equal=reserved_equal and divergence is None,
                        start_exact=exact, first_divergence=divergence,
                        observed=peak.prediction(s, simulated_events, tuple(ooms), divergence))


def _freeable(alloc: Allocator, recorded: Sequence[SegmentEvent]) -> list[str]:
    """The private pools whose segments the trace gives back here: their graphs were released (in the order
    the trace names them; torch walks them in a hash map's order)."""
    pools: list[str] = []
    for e in recorded:
        pool = alloc.pool_at(e.addr) if e.action == "segment_free" else None
        if pool is not None and pool != DEFAULT_POOL and pool not in pools:
            pools.append(pool)
    return pools


def _common_prefix(a: Sequence[SegmentEvent], b: Sequence[SegmentEvent]) -> int:
    k = 0
    while k < len(a) and k < len(b) and a[k] == b[k]:
        k += 1
    return k


def _segment_kind(recorded: Sequence[SegmentEvent], simulated: Sequence[SegmentEvent]) -> str:
    mapped = {"segment_map", "segment_unmap"}
    if any(e.action in mapped for e in recorded) != any(e.action in mapped for e in simulated) \
            and recorded and simulated:
        return "expandable_switched"
    grew_r = any(e.action in ("segment_alloc", "segment_map") for e in recorded)
    grew_s = any(e.action in ("segment_alloc", "segment_map") for e in simulated)
    if grew_r and not grew_s:
        return "trace_reserved"
    if grew_s and not grew_r:
        return "simulation_reserved"
    if any(e.action in mapped for e in recorded) and not simulated:
        return "expandable_switched"
    return "segment_differs"


def oom_capacity(snapshot: Snapshot, timeline: Timeline, device: int) -> int | None:
    """What the first OOM entry proves PyTorch could hold then: reserved at it + the bytes the driver reported
    free (None: no OOM entry with a free figure)."""
    t = snapshot.trace(device)
    free = t.device_free
    for i in np.flatnonzero(t.action == OOM).tolist():
        if i in free:
            return timeline[device].reserved_at(i) + int(free[i])
    return None


@gc_paused()
def predict_device(snapshot: Snapshot, timeline: Timeline, device: int, settings: AllocatorSettings,
                   capacity: int | None, total: int | None = None, start: StartState | None = None) -> Prediction:
    """The trace's requests under `settings` on a device where PyTorch may reserve `capacity` bytes (None:
    unbounded), up to the first request the program would have met differently (see the module docstring)."""
    t = snapshot.trace(device)
    driver = _CapacityDriver(capacity, total if total is not None else capacity)
    alloc = _start(start if start is not None else start_state(snapshot, timeline, device), settings, driver)
    free_action = FREE_COMPLETED if bool((t.action == FREE_COMPLETED).any()) else FREE_REQUESTED
    peak = _Peak(alloc)
    ooms: list[OomOutcome] = []
    stop: Divergence | None = None
    burst: list[int] = []
    moved: dict[int, int] = {}                           # blocks live before the window keep their addresses
    n = len(t)
    for i, a, addr, size, stream, pool, _ in _events(snapshot, timeline, device, free_action):
        if a in SEGMENT_ACTIONS:
            if a in SHRINK:
                burst.append(i)
            continue
        if a not in (ALLOC, OOM, free_action):
            if burst:                                   # empty_cache(): the program asked for it
                alloc.release_cached(_freeable(alloc, _recorded(t, burst)))
                burst = []
            continue
        if burst:
            if a == free_action:
                alloc.release_cached(_freeable(alloc, _recorded(t, burst)))
            burst = []
        if a == ALLOC:
            block = alloc.malloc(size, stream, pool)
            if block is None:
                stop = Divergence(index=i, kind="oom_unserved", size=size)
            else:
                moved[addr] = block.addr             # the trace's address → where this simulation put it
        elif a == OOM:
            served = alloc.malloc(size, stream, pool) is not None
            ooms.append(OomOutcome(index=i, request=settings.round_size(size), capacity=capacity, served=served,
                                   reserved=alloc.reserved, largest_free=_largest_free(alloc)))
            if served:
                stop = Divergence(index=i, kind="oom_served", size=size)
        elif alloc.free(moved.pop(addr, addr)) is None:
            stop = Divergence(index=i, kind="unknown_free", size=size)
        if alloc.reserved > peak.reserved:
            peak.update(alloc, i)
        if stop is not None:
            break
    return peak.prediction(settings, stop.index + 1 if stop is not None else n, tuple(ooms), stop)


class _Peak:
    """The highest reserved bytes a simulation reached, and its free space then."""

    def __init__(self, alloc: Allocator) -> None:
        self.index = -1
        self.reserved = alloc.reserved
        self.unallocated = alloc.reserved - alloc.allocated_bytes
        self.largest = _largest_free(alloc)

    def update(self, alloc: Allocator, index: int) -> None:
        self.index, self.reserved = index, alloc.reserved
        self.unallocated, self.largest = alloc.reserved - alloc.allocated_bytes, _largest_free(alloc)

    def prediction(self, settings: AllocatorSettings, simulated: int, ooms: tuple[OomOutcome, ...],
                   stop: Divergence | None) -> Prediction:
        return Prediction(settings=settings.conf(), simulated=simulated, reserved_peak=self.reserved,
                          peak_index=self.index, unallocated_at_peak=self.unallocated,
                          largest_free_at_peak=self.largest, ooms=ooms, stop=stop)


def _largest_free(alloc: Allocator) -> int:
    return max((p.largest() for p in alloc.pools.values()), default=0)


def whatif_device(snapshot: Snapshot, timeline: Timeline, device: int, settings: AllocatorSettings,
                  capacity: int | None = None, total: int | None = None,
                  start: StartState | None = None, observed: Prediction | None = None) -> DeviceWhatIf:
    """What-if mode (see the module docstring): `settings` against the recorded ones, the same capacity.
    `observed`: a replay's figures that reproduced the whole trace, which stand for the recorded settings
    (what the allocator did) instead of simulating them again."""
    start = start if start is not None else start_state(snapshot, timeline, device)
    source = "given"
    if capacity is None:
        capacity = oom_capacity(snapshot, timeline, device)
        source = "oom" if capacity is not None else "none"
    recorded = of_snapshot(snapshot.allocator_settings)
    dt = timeline[device]
    return DeviceWhatIf(device=device, capacity=capacity, capacity_source=source,
                        trace_reserved_peak=int(max(dt.baseline_reserved, int(dt.reserved.max()) if len(dt) else 0)),
                        baseline=observed if observed is not None else
                        predict_device(snapshot, timeline, device, recorded, capacity, total, start),
                        changed=predict_device(snapshot, timeline, device, settings, capacity, total, start))
