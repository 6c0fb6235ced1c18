"""Replay a snapshot's trace into exact memory curves, per device.

Contract: `replay(snapshot)` returns a Timeline whose per-device curves hold, after each event i of that
device's trace, the bytes that were live:
- `active`: Σ requested (unrounded) bytes of live blocks — exact. A block is live from its `alloc` to its
  `free_completed` (or its `free_requested` where `skip_actions` dropped the completion; a completion
  still pending at the snapshot, the block `active_pending_free` in segments, keeps it live). Blocks live
  before the window began count from the start: (a) a free whose address had no earlier alloc (size from
  the free entry), (b) an active block in `segments` that no alloc in the window created (its requested size).
- `reserved`: Σ segment bytes — exact: Σ total_size of the device's segments minus the net of the segment
  events, then segment_alloc/map (+) and segment_free/unmap (−) in order.
- `allocated_est`: Σ block sizes as the allocator rounds them, falling at `free_requested` — an ESTIMATE
  (rounding to 512 bytes; the real block may keep an unsplit remainder), exact only for blocks known from
  `segments`.
A curve that would go below zero proves the trace contradicts itself (it frees more than it allocated or
reserved): that is a BadInputError naming the device and the event, never a negative number.
`lifetimes` lists every block lifetime (one row per alloc…free, pre-window blocks included) and is what
attribution reads; it is built on first use, so finding peaks never pays for it. `check_invariants()`
proves the replay against the end state. All work is vectorised.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from .display import HtmlDisplay
from .errors import BadInputError
from .model import (
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

if TYPE_CHECKING:                     # pandas loads when lifetimes are first asked for
    import pandas as pd

ORIGINS = ("trace", "before window, freed in trace", "before window, live throughout")


def rounded_size(size: np.ndarray) -> np.ndarray:
    """The allocator's default rounding: < 512 → 512, else up to a multiple of 512 (an estimate)."""
    size = np.asarray(size, dtype=np.int64)
    return np.maximum(512, (size + 511) // 512 * 512)


@dataclass(frozen=True, eq=False)
class DeviceTimeline:
    """Curves and block lifetimes of one device. Index i of a curve = state after event i."""

    device: int
    active: np.ndarray
    allocated_est: np.ndarray
    reserved: np.ndarray
    time_us: np.ndarray | None
    baseline_active: int
    baseline_allocated_est: int
    baseline_reserved: int
    lifetimes_source: pd.DataFrame | Callable[[], pd.DataFrame] = field(repr=False)
    problems: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.active)

    @cached_property
    def lifetimes(self) -> pd.DataFrame:
        """One row per block lifetime (built on first use: peaks never need it)."""
        source = self.lifetimes_source
        return source() if callable(source) else source

    def active_at(self, index: int) -> int:
        """Active bytes after event `index` (−1: before the first event)."""
        return self.baseline_active if index < 0 else int(self.active[index])

    def reserved_at(self, index: int) -> int:
        return self.baseline_reserved if index < 0 else int(self.reserved[index])

    def allocated_est_at(self, index: int) -> int:
        return self.baseline_allocated_est if index < 0 else int(self.allocated_est[index])

    def time_at(self, index: int) -> int | None:
        if self.time_us is None or index < 0 or len(self.time_us) == 0:
            return None
        return int(self.time_us[index])

    def live_at(self, index: int) -> pd.DataFrame:
        """Lifetimes live after event `index` (−1: at the start of the window)."""
        lt = self.lifetimes
        alive = (lt["alloc_index"].to_numpy() <= index) & (
            (lt["free_index"].to_numpy() < 0) | (lt["free_index"].to_numpy() > index))
        return lt[alive]


@dataclass(frozen=True, eq=False)
class Timeline(HtmlDisplay):
    """The replay of every device of a snapshot."""

    snapshot: Snapshot
    devices: dict[int, DeviceTimeline]

    def __getitem__(self, device: int) -> DeviceTimeline:
        return self.devices[device]

    def check_invariants(self) -> list[str]:
        """Problems found proving the replay against the end state (empty when it holds)."""
        return [p for d in self.devices.values() for p in d.problems]


def _first_per_span(mask: np.ndarray, span_id: np.ndarray, order: np.ndarray, n_spans: int) -> np.ndarray:
    """Event index of the first masked event of each span (−1: none); span_id is non-decreasing."""
    pos = np.flatnonzero(mask)
    out = np.full(n_spans, -1, dtype=np.int64)
    if len(pos):
        spans = span_id[pos]
        first = np.ones(len(pos), dtype=bool)
        first[1:] = spans[1:] != spans[:-1]
        out[spans[first]] = order[pos[first]]
    return out


def _address_order(addr: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """`idx` sorted by (address, index). When the address range and the positions fit in 64 bits together,
    one in-place sort of packed keys (address offset high, position low) does it in half the time of a
    stable argsort."""
    keys = addr[idx]
    if len(keys) < 2:
        return idx
    low = keys.min()
    pos_bits = (len(keys) - 1).bit_length()
    if int(keys.max() - low).bit_length() + pos_bits > 64:
        return idx[np.argsort(keys, kind="stable")]
    packed = keys - low
    packed <<= np.uint64(pos_bits)
    packed |= np.arange(len(keys), dtype=np.uint64)
    packed.sort()
    packed &= np.uint64((1 << pos_bits) - 1)
    return idx[packed.astype(np.int64)]


def _member(values: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """values ∈ pool, element-wise, for an ascending `pool` (binary search instead of np.isin's sort)."""
    if not len(pool) or not len(values):
        return np.zeros(len(values), dtype=bool)
    pos = np.minimum(np.searchsorted(pool, values), len(pool) - 1)
    return pool[pos] == values


@dataclass(frozen=True, eq=False)
class _Spans:
    """The block lifetimes of one device's trace: one span per alloc (or per address first seen freeing a
    block from before the window), in address order; event indices are −1 where a span has no such event."""

    start_ev: np.ndarray       # the span's first event (its alloc, or the free of a pre-window block)
    from_alloc: np.ndarray     # the span starts at an alloc
    requested: np.ndarray      # its free_requested
    completed: np.ndarray      # its free_completed
    addr: np.ndarray           # ascending
    last: np.ndarray           # the last span at its address

    def __len__(self) -> int:
        return len(self.start_ev)


def _pair_spans(action: np.ndarray, addr: np.ndarray) -> _Spans:
    """Pair allocs with their frees: sort block events by (address, index); a span starts at each alloc (or at
    the first event of an address, which then belongs to a block from before the window)."""
    idx = np.flatnonzero((action == ALLOC) | (action == FREE_REQUESTED) | (action == FREE_COMPLETED))
    order = _address_order(addr, idx)
    addr_s, act_s = addr[order], action[order]
    new_addr = np.ones(len(order), dtype=bool)
    new_addr[1:] = addr_s[1:] != addr_s[:-1]
    span_start = new_addr | (act_s == ALLOC)
    span_id = np.cumsum(span_start) - 1
    start_pos = np.flatnonzero(span_start)
    n_spans = len(start_pos)
    span_addr = addr_s[start_pos]
    last = np.ones(n_spans, dtype=bool)
    last[:-1] = span_addr[1:] != span_addr[:-1]
    return _Spans(start_ev=order[start_pos], from_alloc=act_s[start_pos] == ALLOC,
                  requested=_first_per_span(act_s == FREE_REQUESTED, span_id, order, n_spans),
                  completed=_first_per_span(act_s == FREE_COMPLETED, span_id, order, n_spans),
                  addr=span_addr, last=last)


@dataclass(frozen=True, eq=False)
class _EndBlocks:
    """The active blocks of the end state on one device (rows into `block_columns`)."""

    rows: np.ndarray
    addr: np.ndarray
    requested: np.ndarray
    size: np.ndarray
    pending_addr: np.ndarray   # sorted addresses of blocks whose free is still pending


def _end_blocks(snapshot: Snapshot, device: int) -> _EndBlocks:
    blocks = snapshot.block_columns
    rows = np.flatnonzero((blocks["device"] == device) & np.isin(blocks["state"], ACTIVE_STATES))
    addr = blocks["address"][rows]
    return _EndBlocks(rows=rows, addr=addr, requested=blocks["requested_size"][rows].astype(np.int64),
                      size=blocks["size"][rows].astype(np.int64),
                      pending_addr=np.sort(addr[blocks["state"][rows] != "active_allocated"]))


def _block_of(spans: _Spans, live_end: np.ndarray, end: _EndBlocks) -> np.ndarray:
    """The end-state block row of each span live at the end (for exact sizes, frames, checks), else −1."""
    span_block = np.full(len(spans), -1, dtype=np.int64)
    if len(end.rows) and live_end.any():
        sorter = np.argsort(end.addr, kind="stable")
        where = np.minimum(np.searchsorted(end.addr, spans.addr[live_end], sorter=sorter), len(end.addr) - 1)
        hit = end.addr[sorter[where]] == spans.addr[live_end]
        span_block[np.flatnonzero(live_end)] = np.where(hit, end.rows[sorter[where]], -1)
    return span_block


def _curve(n: int, starts: np.ndarray, gains: np.ndarray, ends: np.ndarray, losses: np.ndarray,
           baseline: int) -> np.ndarray:
    """baseline + Σ gains from their event on − Σ losses from their event on, after each of n events."""
    delta = np.zeros(n, dtype=np.int64)
    delta[starts] = gains
    delta[ends] -= losses
    curve = np.cumsum(delta, out=delta)          # in place: three curves of n int64 each are the bulk
    curve += baseline
    return curve


def _problems(device: int, spans: _Spans, live_end: np.ndarray, span_block: np.ndarray, span_size: np.ndarray,
              snapshot: Snapshot, end: _EndBlocks, explained: np.ndarray) -> list[str]:
    """What proves the replay wrong against the end state (see `Timeline.check_invariants`)."""
    problems = []
    all_req = snapshot.block_columns["requested_size"]
    known_req = all_req[np.maximum(span_block, 0)] if len(all_req) else span_size  # no blocks at all
    mismatch = live_end & ((span_block < 0) | (span_size != np.where(span_block >= 0, known_req, span_size)))
    for i in np.flatnonzero(mismatch)[:5]:
        problems.append(f"device {device}: block at 0x{int(spans.addr[i]):x} ({int(span_size[i])} bytes) is "
                        "live at the end of the trace but not active with that size in segments")
    if mismatch.sum() > 5:
        problems.append(f"device {device}: … {int(mismatch.sum()) - 5} more such blocks")
    stale = _member(end.addr[~explained], spans.addr[~live_end & spans.from_alloc])
    if stale.any():
        n = int(stale.sum())
        blocks = "1 block active in segments was" if n == 1 else f"{n:,} blocks active in segments were"
        problems.append(f"device {device}: {blocks} freed in the trace and never allocated again")
    return problems


def _never_negative(snapshot: Snapshot, device: int, curves: dict[str, tuple[int, np.ndarray]]) -> None:
    """A curve below zero (before the window or after some event) proves the trace contradicts itself."""
    for name, (baseline, curve) in curves.items():
        low = int(curve.argmin()) if len(curve) else -1
        if baseline < 0 or (low >= 0 and curve[low] < 0):
            where = "before the trace begins" if baseline < 0 else f"after device_traces[{device}][{low}]"
            value = baseline if baseline < 0 else int(curve[low])
            raise BadInputError(snapshot.source, f"inconsistent trace: device {device}'s {name} bytes would be "
                                f"{value:,} {where}: its events free more than was ever allocated or reserved")


def _replay_device(snapshot: Snapshot, device: int) -> DeviceTimeline:
    trace = snapshot.trace(device)
    action, size = trace.action, trace.size
    n = len(action)
    spans = _pair_spans(action, trace.addr)
    end = _end_blocks(snapshot, device)

    # A free_requested whose completion is still pending when the snapshot was taken (the last span at its
    # address, with no free_completed, and the block `active_pending_free` in segments) stays active.
    pending = (spans.completed < 0) & (spans.requested >= 0) & spans.last & _member(spans.addr, end.pending_addr)
    free_ev = np.where(spans.completed >= 0, spans.completed, spans.requested)
    active_end = np.where(pending, -1, free_ev)
    allocated_end = np.where(spans.requested >= 0, spans.requested, spans.completed)
    span_size = np.where(spans.from_alloc, size[spans.start_ev], size[np.maximum(free_ev, 0)]) if len(spans) \
        else np.zeros(0, dtype=np.int64)
    live_end = active_end < 0
    explained = _member(end.addr, spans.addr[live_end])      # end-state blocks the trace allocated
    pre_live_rows = end.rows[~explained]
    span_block = _block_of(spans, live_end, end)
    est = rounded_size(span_size)
    known = span_block >= 0
    if known.any():
        est[known] = snapshot.block_columns["size"][span_block[known]].astype(np.int64)

    alloc, pre_freed = spans.from_alloc, ~spans.from_alloc
    ended, aended = active_end >= 0, allocated_end >= 0
    baseline_active = int(span_size[pre_freed].sum() + end.requested[~explained].sum())
    active = _curve(n, spans.start_ev[alloc], span_size[alloc], active_end[ended], span_size[ended], baseline_active)
    baseline_alloc = int(est[pre_freed].sum() + end.size[~explained].sum())
    allocated = _curve(n, spans.start_ev[alloc], est[alloc], allocated_end[aended], est[aended], baseline_alloc)
    grow = np.flatnonzero((action == SEGMENT_ALLOC) | (action == SEGMENT_MAP))
    shrink = np.flatnonzero((action == SEGMENT_FREE) | (action == SEGMENT_UNMAP))
    segs = snapshot.segment_columns
    baseline_reserved = int(segs["total_size"][segs["device"] == device].sum()) - int(size[grow].sum()) \
        + int(size[shrink].sum())
    reserved = _curve(n, grow, size[grow], shrink, size[shrink], baseline_reserved)

    def lifetimes() -> pd.DataFrame:
        import pandas as pd
        pre = len(pre_live_rows)
        return pd.DataFrame({
            "addr": np.concatenate([spans.addr, end.addr[~explained]], dtype=np.uint64),
            "size": np.concatenate([span_size, end.requested[~explained]], dtype=np.int64),
            "allocated_est": np.concatenate([est, end.size[~explained]], dtype=np.int64),
            "alloc_index": np.concatenate([np.where(alloc, spans.start_ev, -1), np.full(pre, -1)], dtype=np.int64),
            "free_index": np.concatenate([active_end, np.full(pre, -1)], dtype=np.int64),
            "free_requested_index": np.concatenate([spans.requested, np.full(pre, -1)], dtype=np.int64),
            "stream": np.concatenate([trace.stream[spans.start_ev] if len(spans) else np.zeros(0, np.int64),
                                      snapshot.block_columns["stream"][pre_live_rows]], dtype=np.int64),
            "block_row": np.concatenate([span_block, pre_live_rows], dtype=np.int64),
            "origin": pd.Categorical.from_codes(
                np.concatenate([np.where(alloc, 0, 1), np.full(pre, 2)], dtype=np.int8),
                categories=list(ORIGINS)),
        })

    _never_negative(snapshot, device, {"active": (baseline_active, active), "reserved": (baseline_reserved, reserved),
                                       "allocated": (baseline_alloc, allocated)})
    problems = _problems(device, spans, live_end, span_block, span_size, snapshot, end, explained)
    return DeviceTimeline(device=device, active=active, allocated_est=allocated, reserved=reserved,
                          time_us=trace.time_us, baseline_active=baseline_active,
                          baseline_allocated_est=baseline_alloc, baseline_reserved=baseline_reserved,
                          lifetimes_source=lifetimes, problems=tuple(problems))


def replay(snapshot: Snapshot) -> Timeline:
    """Replay every device of `snapshot` (see the module docstring for what is exact)."""
    return Timeline(snapshot=snapshot, devices={d: _replay_device(snapshot, d) for d in snapshot.devices})
