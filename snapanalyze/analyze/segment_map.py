"""The segment map at an instant: every segment the allocator reserved, cut into its blocks' pieces.

Contract: `segment_map(snapshot, timeline, device, index, request=None, stream=None)` returns a
`SegmentMap` of `device` right after event `index` (−1: before the first event). `segments` has one row
per segment (address order) with its bytes by state; `pieces` lays each segment out from its start as
pieces of one state each — "active" (a live block), "pending_free" (freed by the program, the allocator
still waiting on a stream that used it) or "inactive" (free: cached by the allocator, reusable). The state
is read from the end state when no event after `index` allocated, freed or (un)mapped memory (`exact`:
the snapshot holds that very moment, as after an OOM observer's dump); otherwise it is laid out from the
replay — the segments of that moment (the segment events after it undone) and the blocks live then at
their addresses, with the allocator's rounding estimated — and `exact` is False, `source` says so. Free
pieces are the gaps, so the map always covers every reserved byte (Σ piece sizes = reserved).
`largest_free` is the largest free piece a request could take: given a `request` (its rounded size and
stream) the one the allocator could hand it (same stream, default pool, the small or large pool by its
size, honouring max_split_size, as `explain_oom` decides usability), else the largest of all;
`largest_free_any_bytes` the largest of all. Fragmentation is visible as a request larger than every
usable free piece although the free pieces together would hold it.

`segments` columns: SEGMENT_COLUMNS; `pieces` columns: PIECE_COLUMNS (offset from the segment's start;
requested: the requested bytes of an active or pending block, 0 for free pieces). All work is columnar.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..allocator.settings import SMALL_BUFFER
from ..allocator.state import DEFAULT_POOL
from ..allocator.usable import usable_mask
from ..model import (
    ACTIVE_STATES,
    ALLOC,
    FREE_COMPLETED,
    FREE_REQUESTED,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    Snapshot,
)
from ..replay import Timeline

STATES = ("active", "pending_free", "inactive")
SEGMENT_COLUMNS = ["address", "size", "stream", "pool", "segment_type", "active_bytes", "pending_free_bytes",
                   "inactive_bytes", "largest_free_bytes", "pieces"]
PIECE_COLUMNS = ["segment_address", "offset", "size", "state", "requested"]


@dataclass(frozen=True)
class FreePiece:
    """One free piece: its segment, offset from the segment's start and size."""

    segment_address: int
    offset: int
    size: int


@dataclass(frozen=True, eq=False)
class SegmentMap:
    """Segments and their pieces at one instant (see the module docstring)."""

    device: int
    index: int
    exact: bool
    source: str
    segments: pd.DataFrame
    pieces: pd.DataFrame
    request_bytes: int | None
    request_stream: int | None
    largest_free: FreePiece | None             # the largest usable free piece (any, without a request)
    largest_free_any_bytes: int
    unplaced_blocks: int = 0                   # live blocks (estimated layout) that no segment of the moment holds

    @property
    def reserved_bytes(self) -> int:
        return int(self.segments["size"].sum())

    @property
    def free_bytes(self) -> int:
        """Bytes of the free (inactive) pieces: reserved but free."""
        return int(self.segments["inactive_bytes"].sum())


_BLOCK_CHANGING = (ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP)


def is_last_block_change(snapshot: Snapshot, device: int, index: int) -> bool:
    """Whether no event after `index` on `device` allocated, freed or (un)mapped memory."""
    action = snapshot.trace(device).action[index + 1:]
    return not np.isin(action, _BLOCK_CHANGING).any()


def _segments_at(snapshot: Snapshot, device: int, index: int) -> pd.DataFrame:
    """address, size, stream, pool, segment_type of the segments of `device` right after event `index`: the end
    state's, with every segment event after `index` undone (the earliest one per address decides)."""
    segs = snapshot.segment_columns
    on = segs["device"] == device
    end = pd.DataFrame({"address": segs["address"][on].astype(np.uint64),
                        "size": segs["total_size"][on].astype(np.int64), "stream": segs["stream"][on].astype(np.int64),
                        "pool": segs["pool_id"][on].astype(str), "segment_type": segs["segment_type"][on].astype(str)})
    t = snapshot.trace(device)
    later = np.arange(index + 1, len(t))
    kinds = t.action[later]
    grow = np.isin(kinds, (SEGMENT_ALLOC, SEGMENT_MAP))
    shrink = np.isin(kinds, (SEGMENT_FREE, SEGMENT_UNMAP))
    events = later[grow | shrink]
    if not len(events):
        return end
    addr = t.addr[events].astype(np.uint64)
    _, first = np.unique(addr, return_index=True)          # the earliest later event per address
    events, addr = events[first], addr[first]
    made_later = np.isin(t.action[events], (SEGMENT_ALLOC, SEGMENT_MAP))
    kept = end[~np.isin(end["address"].to_numpy(dtype=np.uint64), addr)]
    gone = events[~made_later]                              # freed later: it existed at `index`
    size = t.size[gone].astype(np.int64)
    details = t.details
    if details.pool_id is not None:
        names = np.asarray(details.pool_id_names + ("",), dtype=object)
        codes = details.pool_id[gone].astype(np.int64)
        pool = np.where(codes >= 0, names[np.where(codes >= 0, codes, len(names) - 1)], DEFAULT_POOL).astype(str)
        pool = np.where(pool == "", DEFAULT_POOL, pool)
    else:
        pool = np.full(len(gone), DEFAULT_POOL, dtype=object)
    back = pd.DataFrame({"address": addr[~made_later], "size": size, "stream": t.stream[gone].astype(np.int64),
                         "pool": pool.astype(str),
                         "segment_type": np.where(size <= SMALL_BUFFER, "small", "large").astype(str)})
    return pd.concat([kept, back], ignore_index=True)


def _occupied_end(snapshot: Snapshot, device: int) -> pd.DataFrame:
    """The blocks in use in the end state: address, size, requested, pending (exact)."""
    b = snapshot.block_columns
    rows = np.flatnonzero((b["device"] == device) & np.isin(b["state"], ACTIVE_STATES))
    return pd.DataFrame({"address": b["address"][rows].astype(np.uint64), "size": b["size"][rows].astype(np.int64),
                         "requested": b["requested_size"][rows].astype(np.int64),
                         "pending": b["state"][rows] != "active_allocated"})


def _occupied_replay(timeline: Timeline, device: int, index: int) -> pd.DataFrame:
    """The blocks live right after `index` from the replay (rounded sizes estimated where not known)."""
    live = timeline[device].live_at(index)
    requested_at = live["free_requested_index"].to_numpy(dtype=np.int64)
    return pd.DataFrame({"address": live["addr"].to_numpy(dtype=np.uint64),
                         "size": live["allocated_est"].to_numpy(dtype=np.int64),
                         "requested": live["size"].to_numpy(dtype=np.int64),
                         "pending": (requested_at >= 0) & (requested_at <= index)})


def _lay_out(segments: pd.DataFrame, occupied: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """The pieces of every segment: the occupied blocks it holds and the free gaps between them (address
    order; a block overlapping the previous one is clipped to it). Also the number of blocks outside every
    segment."""
    segments = segments.sort_values("address", kind="stable", ignore_index=True)
    seg_addr = segments["address"].to_numpy(dtype=np.uint64)
    seg_end = seg_addr + segments["size"].to_numpy(dtype=np.int64).astype(np.uint64)
    occupied = occupied.sort_values("address", kind="stable", ignore_index=True)
    addr = occupied["address"].to_numpy(dtype=np.uint64)
    seg = np.searchsorted(seg_addr, addr, side="right").astype(np.int64) - 1
    inside = (seg >= 0) & (addr < seg_end[np.maximum(seg, 0)]) if len(seg_addr) else np.zeros(len(addr), bool)
    unplaced = int((~inside).sum())
    occupied, seg, addr = occupied[inside].reset_index(drop=True), seg[inside], addr[inside]
    start = (addr - seg_addr[seg]).astype(np.int64)
    seg_size = segments["size"].to_numpy(dtype=np.int64)
    end = np.minimum(start + occupied["size"].to_numpy(dtype=np.int64), seg_size[seg])
    # the end of everything before each block in its segment (a running max per segment; 0 for its first)
    first = np.ones(len(seg), dtype=bool)
    first[1:] = seg[1:] != seg[:-1]
    reach = pd.Series(end).groupby(seg).cummax().to_numpy(dtype=np.int64)
    prev_end = np.where(first, 0, np.concatenate([[0], reach[:-1]]))
    start = np.maximum(start, prev_end)
    end = np.maximum(end, start)
    used = pd.DataFrame({"seg": seg, "offset": start, "size": end - start,
                         "state": np.where(occupied["pending"].to_numpy(dtype=bool), "pending_free", "active"),
                         "requested": occupied["requested"].to_numpy(dtype=np.int64)})
    used = used[used["size"] > 0]
    gaps = pd.DataFrame({"seg": seg, "offset": prev_end, "size": start - prev_end, "state": "inactive", "requested": 0})
    # what follows the last block of each segment, and segments holding no block at all
    last_end = np.zeros(len(segments), dtype=np.int64)
    if len(seg):
        np.maximum.at(last_end, seg, end)
    tails = pd.DataFrame({"seg": np.arange(len(segments)), "offset": last_end, "size": seg_size - last_end,
                          "state": "inactive", "requested": 0})
    pieces = pd.concat([used, gaps[gaps["size"] > 0], tails[tails["size"] > 0]], ignore_index=True)
    pieces = pieces.sort_values(["seg", "offset"], kind="stable", ignore_index=True)
    pieces.insert(0, "segment_address", seg_addr[pieces["seg"].to_numpy(dtype=np.int64)])
    pieces = pieces.drop(columns="seg")
    pieces["state"] = pd.Categorical(pieces["state"], categories=list(STATES))
    return pieces.astype({"offset": np.int64, "size": np.int64, "requested": np.int64})[PIECE_COLUMNS], unplaced


def _summaries(segments: pd.DataFrame, pieces: pd.DataFrame) -> pd.DataFrame:
    by = pieces.groupby(["segment_address", "state"], observed=False)["size"].sum().unstack("state", fill_value=0)
    by = by.reindex(columns=list(STATES), fill_value=0)
    free = pieces[pieces["state"] == "inactive"].groupby("segment_address")["size"].max()
    count = pieces.groupby("segment_address").size()
    out = segments.sort_values("address", kind="stable", ignore_index=True).copy()
    a = out["address"]
    for state in STATES:
        out[f"{state}_bytes"] = a.map(by[state]).fillna(0).astype(np.int64).to_numpy()
    out["largest_free_bytes"] = a.map(free).fillna(0).astype(np.int64).to_numpy()
    out["pieces"] = a.map(count).fillna(0).astype(np.int64).to_numpy()
    return out[SEGMENT_COLUMNS]


def usable(pieces: pd.DataFrame, segments: pd.DataFrame, request: int, stream: int, max_split: int) -> np.ndarray:
    """Which free pieces the allocator could give `request` bytes on `stream` in the default pool
    (`allocator.usable.usable_mask`, the rule explain-oom applies)."""
    info = segments.set_index("address")
    seg = pieces["segment_address"]
    return ((pieces["state"] == "inactive").to_numpy()
            & usable_mask(pieces["size"].to_numpy(), seg.map(info["stream"]).to_numpy(),
                          seg.map(info["pool"]).to_numpy(), seg.map(info["segment_type"]).to_numpy(),
                          request, stream, DEFAULT_POOL, max_split))


def segment_map(snapshot: Snapshot, timeline: Timeline, device: int, index: int, request: int | None = None,
                stream: int | None = None) -> SegmentMap:
    """The segment map of `device` right after event `index` (see the module docstring)."""
    exact = is_last_block_change(snapshot, device, index)
    segments = _segments_at(snapshot, device, index)
    if exact:
        source = "end state (no event after this instant changed memory)"
        occupied = _occupied_end(snapshot, device)
    else:
        source = ("laid out from the replay: the segments of that moment and the blocks live then, at their "
                  "addresses, with the allocator's rounding estimated")
        occupied = _occupied_replay(timeline, device, index)
    pieces, unplaced = _lay_out(segments, occupied)
    table = _summaries(segments, pieces)
    free = pieces["state"].to_numpy() == "inactive"
    any_largest = int(pieces["size"].to_numpy()[free].max()) if free.any() else 0
    pick = free
    if request is not None:
        settings = snapshot.allocator_settings or {}
        pick = usable(pieces, table, int(request), int(stream or 0), int(settings.get("max_split_size") or -1))
    largest = None
    if pick.any():
        sizes = np.where(pick, pieces["size"].to_numpy(dtype=np.int64), -1)
        at = int(np.argmax(sizes))                          # the first (lowest address) of the largest
        row = pieces.iloc[at]
        largest = FreePiece(int(row["segment_address"]), int(row["offset"]), int(row["size"]))
    return SegmentMap(device=device, index=index, exact=exact, source=source, segments=table, pieces=pieces,
                      request_bytes=None if request is None else int(request),
                      request_stream=None if request is None else int(stream or 0), largest_free=largest,
                      largest_free_any_bytes=any_largest, unplaced_blocks=unplaced)
