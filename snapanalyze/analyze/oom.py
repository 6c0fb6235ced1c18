"""Why an allocation failed: the numbers at each `oom` entry and a verdict in plain words.

Contract: `explain_oom(snapshot, …)` returns an `OomExplanation`. For each `oom` trace entry (the rounded
request, its stream, the bytes the driver reported free) it states the live active bytes, reserved,
reserved-but-free (reserved − Σ sizes of blocks in use), the largest free block that could have served the
request (same stream, default pool, small/large pool by the request's size, honouring max_split_size) and
the memory outside the allocator (capacity − reserved − device free when the capacity is known; NVML
splits it into this process and other processes). The free blocks come from the end state's segments when
the `oom` entry is the device's last block-changing event — a snapshot dumped by the OOM observer — and are
otherwise estimated from the replay (live blocks at the entry laid into the segments of that moment), which
`exact` and `state_source` say. Verdicts:
- "fragmentation": no single usable free block fits the request, although reserved-but-free + device free
  (or reserved-but-free alone) would;
- "outside_pressure": the device could not give the request (reserved-but-free + device free < request) and
  NVML measured, around the failure, other processes' bytes or growth of memory outside the allocator at
  least as large as what was missing (NVML samples from idle moments alone never decide);
- "live_exhaustion": the device could not give the request and nothing outside explains it;
- "unexplained" (checked first): a usable free block was large enough, so the state at the failure differs
  from what the file shows.
Each verdict (`OomVerdict`) comes with what decided it, the allocation that failed (`failed`: its bytes, the
code that asked for it from the entry's own frames — `attribute.explain_stack` — its request and span) and
`advice` as data (`Advice`), drawn from the numbers and from the categories live at the failure (`attribute`
at the entry; for a live exhaustion up to three that grew in the window, most bytes first, each against the
shortfall); `report.oom_text` puts them in words. Without any `oom` entry, `no_oom` (`NoOom` per device with
a trace) holds that no allocation failure was recorded and how far the peak stayed below capacity (NVML used
at the peak, else reserved; or that the capacity is unknown); `admission` says whether requests could have
been refused before they allocated (a serving engine's frames, or request markers that say so, see
`rejected_requests`), which only then is said. A device with a state but no trace is `state_only`
(`StateOnly`): no failure can be seen there, and the state's free blocks are set against its live ones.
`session.explain_path(file_or_run)` does this for a file or every rank of a run, with each rank's NVML
samples, markers and capacity.

`OomExplanation.ooms` columns: OOM_COLUMNS (a row per `verdicts` entry). `.categories` columns: device,
index, category, bytes, share, blocks, window_bytes (of those, allocated inside the trace window).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..allocator.settings import SMALL_BUFFER, SMALL_SIZE
from ..allocator.state import DEFAULT_POOL
from ..allocator.usable import usable_mask
from ..model import (
    ACTIVE_STATES,
    ANNOTATE,
    OOM,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    SNAPSHOT,
    Snapshot,
)
from ..replay import DeviceTimeline, Timeline, replay
from .attribute import Attribution, StackView, attribute, explain_stack
from .attribute.result import AttributionAt
from .engine import SERVING_ENGINES, Engine, detect_program
from .kept import KeptAcrossStep, kept_across_step
from .outside import join_samples, outside_at_instant
from .peaks import global_peak_index
from .requests import event_requests
from .rules import RuleSet, shipped_rules
from .spans import open_spans

MiB = 1 << 20
OOM_COLUMNS = [
    "device", "index", "time_us", "stream", "request_bytes", "device_free_bytes", "active_bytes",
    "allocated_bytes", "reserved_bytes", "reserved_free_bytes", "largest_free_block_bytes",
    "largest_free_block_any_bytes", "free_blocks", "pool", "segment_type", "exact", "state_source",
    "capacity_bytes", "capacity_source", "outside_bytes", "outside_source", "own_outside_bytes",
    "other_processes_bytes", "outside_growth_bytes", "shortfall_bytes", "split_segments", "verdict",
]
CATEGORY_COLUMNS = ["device", "index", "category", "bytes", "share", "blocks", "window_bytes"]
UNKNOWN_CAPACITY = "unknown: no NVML samples or meta.json (give the run directory, or --capacity)"


@dataclass(frozen=True)
class Advice:
    """One thing that would have helped, as data (`report.oom_text` words it): `kind` is
    "expandable_segments" (values: reserved_free_bytes, largest_free_bytes), "max_split" (split_mb, segments,
    free_bytes), "isolate", "category" (category, bytes, in_window, shortfall), "kept" (kept: the
    `kept.KeptAcrossStep`, shortfall) or "free_live" (bytes)."""

    kind: str
    values: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FailedAllocation:
    """The allocation an `oom` entry records: the rounded bytes it asked for, the code that asked
    (`attribute.explain_stack`: category, deciding frame, owner, frames; None where the entry carries no
    frames), the request it belongs to ("" : none known) and the `record_function` span it ran in ("")."""

    size: int
    stack: StackView | None
    request: str
    span: str


def failed_allocation(snapshot: Snapshot, device: int, index: int, rules: RuleSet | None = None,
                      markers: pd.DataFrame | None = None) -> FailedAllocation:
    trace = snapshot.trace(device)
    at = np.array([index])
    stack_id = int(snapshot.event_stack_ids(device, at)[0])
    request = str(event_requests(trace, at, markers).names[0] or "")
    span = str(open_spans(snapshot, device, trace.time_us[at])[0]) if trace.time_us is not None else ""
    return FailedAllocation(int(trace.size[index]),
                            explain_stack(snapshot, stack_id, rules or shipped_rules()) if stack_id >= 0 else None,
                            request, span)


@dataclass(frozen=True)
class OomVerdict:
    """The numbers at one `oom` entry (the OOM_COLUMNS, by name), the verdict and what decided it: for
    "outside_pressure" `pressure` ("other_processes" | "outside_growth") and `pressure_bytes`, the NVML
    sample's distance to the failure `sample_gap_us` (positive: before); `advice` in order."""

    device: int
    index: int
    time_us: int | None
    stream: int
    request_bytes: int
    device_free_bytes: int | None
    active_bytes: int
    allocated_bytes: int
    reserved_bytes: int
    reserved_free_bytes: int
    largest_free_block_bytes: int
    largest_free_block_any_bytes: int
    free_blocks: int
    pool: str
    segment_type: str
    exact: bool
    state_source: str
    capacity_bytes: int | None
    capacity_source: str
    outside_bytes: int | None
    outside_source: str | None
    own_outside_bytes: int | None
    other_processes_bytes: int | None
    outside_growth_bytes: int | None
    shortfall_bytes: int
    split_segments: int
    verdict: str
    pressure: str | None = None
    pressure_bytes: int | None = None
    sample_gap_us: int | None = None
    advice: tuple[Advice, ...] = ()
    failed: FailedAllocation | None = None      # the allocation that failed, and the code that asked for it
    kept: KeptAcrossStep | None = None          # forward-pass blocks live there that outlived a training step

    def record(self) -> dict[str, Any]:
        """The OOM_COLUMNS as a dict (one row of `OomExplanation.ooms`)."""
        return {name: getattr(self, name) for name in OOM_COLUMNS}


@dataclass(frozen=True)
class NoOom:
    """A device without an `oom` entry: its peak, what the peak is measured by (`peak_basis`), the capacity
    and headroom when known, and the requests the markers say were refused."""

    device: int
    peak_index: int
    peak_time_us: int | None
    active_bytes: int
    reserved_bytes: int
    nvml_used_bytes: int | None
    peak_basis: str
    capacity_bytes: int | None
    capacity_source: str
    headroom_bytes: int | None   # capacity − the peak; None when unknown, or when the peak exceeds the capacity
    rejected_requests: tuple[dict[str, Any], ...]
    admission: bool = False      # requests could be refused before they allocate: a serving engine, or markers say so
    # the peak past the capacity although nothing failed: the figures contradict each other (a capacity too small,
    # NVML samples of another device): named as such, never a negative headroom
    contradiction_bytes: int | None = None


@dataclass(frozen=True)
class StateOnly:
    """A device of a file that holds the allocator's state but no trace: no allocation failure can be seen in
    it, and this is what the state still proves — reserved bytes, bytes in blocks, the free ones (count and
    the largest, and on which stream it lies), and how many live blocks are larger than that largest free
    block (a request of their size could reuse no free block: it needs a new segment)."""

    device: int
    reserved_bytes: int
    allocated_bytes: int
    reserved_free_bytes: int
    free_blocks: int
    largest_free_block_bytes: int
    largest_free_stream: int | None
    live_blocks: int
    larger_live_blocks: int


@dataclass(frozen=True, eq=False)
class OomExplanation:
    """One row per `oom` entry, the categories live at each, or — without any — the no-OOM statement."""

    snapshot: Snapshot
    timeline: Timeline
    ooms: pd.DataFrame
    categories: pd.DataFrame
    verdicts: tuple[OomVerdict, ...] = ()                      # one per row of `ooms`, in order
    no_oom: tuple[NoOom, ...] = ()                             # one per device, only when there is no oom
    notes: tuple[str, ...] = ()
    engine: Engine | None = None                               # the program: blocks live at the ooms, else every stack
    state_only: tuple[StateOnly, ...] = ()                     # devices with a state and no trace


def _end_state_free(snapshot: Snapshot, device: int) -> tuple[pd.DataFrame, int]:
    """Free blocks of the end state (size, stream, pool, segment_type) and Σ sizes of blocks in use."""
    b = snapshot.blocks[snapshot.blocks["device"] == device]
    in_use = b["state"].isin(ACTIVE_STATES).to_numpy()
    free = b[~in_use]
    out = pd.DataFrame({"size": free["size"].to_numpy(dtype=np.int64),
                        "stream": free["stream"].to_numpy(dtype=np.int64),
                        "pool": free["pool_id"].astype(str).to_numpy(),
                        "segment_type": free["segment_type"].astype(str).to_numpy(),
                        "segment_address": free["segment_address"].to_numpy(dtype=np.uint64)})
    return out, int(b["size"].to_numpy(dtype=np.int64)[in_use].sum())


def _estimated_free(snapshot: Snapshot, dt: DeviceTimeline, index: int) -> tuple[pd.DataFrame, int]:
    """Free gaps at event `index`: segments of that moment minus the live blocks (rounded sizes), estimated."""
    device = dt.device
    segs = snapshot.segments[snapshot.segments["device"] == device]
    seg = {int(a): (int(s), int(st), str(p), str(ty)) for a, s, st, p, ty in zip(
        segs["address"], segs["total_size"], segs["stream"], segs["pool_id"].astype(str), segs["segment_type"])}
    t = snapshot.trace(device)
    later = np.arange(index + 1, len(t))
    for i in later[::-1]:                                   # undo segment events after the instant, newest first
        a, act = int(t.addr[i]), int(t.action[i])
        size = int(t.size[i])
        if act in (SEGMENT_ALLOC, SEGMENT_MAP):
            seg.pop(a, None)
        elif act in (SEGMENT_FREE, SEGMENT_UNMAP):
            seg[a] = (size, int(t.stream[i]), DEFAULT_POOL, "small" if size <= SMALL_BUFFER else "large")
    live = dt.live_at(index)
    starts = live["addr"].to_numpy(dtype=np.uint64)
    sizes = live["allocated_est"].to_numpy(dtype=np.int64)
    order = np.argsort(starts, kind="stable")
    starts, sizes = starts[order], sizes[order]
    rows = []
    for a in sorted(seg):
        total, stream, pool, kind = seg[a]
        lo = int(np.searchsorted(starts, np.uint64(a), side="left"))
        hi = int(np.searchsorted(starts, np.uint64(a + total), side="left"))
        pos = a
        for s, n in zip(starts[lo:hi].tolist(), sizes[lo:hi].tolist()):
            if s > pos:
                rows.append((s - pos, stream, pool, kind, a))
            pos = max(pos, s + n)
        if a + total > pos:
            rows.append((a + total - pos, stream, pool, kind, a))
    out = pd.DataFrame(rows, columns=["size", "stream", "pool", "segment_type", "segment_address"])
    out["size"] = out["size"].astype(np.int64)
    out["segment_address"] = out["segment_address"].astype(np.uint64)
    return out, dt.allocated_est_at(index)


def _usable(free: pd.DataFrame, request: int, stream: int, pool: str, max_split: int) -> pd.DataFrame:
    return free[usable_mask(free["size"].to_numpy(), free["stream"].to_numpy(), free["pool"].to_numpy(),
                            free["segment_type"].to_numpy(), request, stream, pool, max_split)]


def _last_change(action: np.ndarray) -> np.ndarray:
    """Per trace entry, the index of the last entry at or before it that changed memory (−1: none): oom, snapshot
    and annotate entries change nothing."""
    changes = (action != OOM) & (action != SNAPSHOT) & (action != ANNOTATE)
    return np.maximum.accumulate(np.where(changes, np.arange(len(action)), -1)) if len(action) else \
        np.zeros(0, dtype=np.int64)


def _split_segments(snapshot: Snapshot, device: int) -> pd.DataFrame:
    b = snapshot.blocks[(snapshot.blocks["device"] == device) & (snapshot.blocks["segment_type"] == "large")]
    if not len(b):
        return pd.DataFrame(columns=["segment_address", "segment_size", "free_bytes"])
    in_use = b["state"].isin(ACTIVE_STATES)
    g = b.assign(in_use=in_use, free=np.where(in_use, 0, b["size"]),
                 big_free=(~in_use) & (b["size"] > MiB)).groupby("segment_address")
    agg = g.agg(segment_size=("size", "sum"), free_bytes=("free", "sum"), any_use=("in_use", "any"),
                any_big_free=("big_free", "any")).reset_index()
    return agg[agg["any_use"] & agg["any_big_free"]][["segment_address", "segment_size", "free_bytes"]]


ADVISED_CATEGORIES = 3       # categories a live exhaustion's advice names, most bytes first


def _advice_for_categories(cats: pd.DataFrame, shortfall: int = 0) -> list[Advice]:
    """Advice about the categories that grew most inside the window, most bytes first (else the largest live
    one): what each holds is what changing it could free, set against the `shortfall` the request missed."""
    if not len(cats):
        return []
    window = cats[cats["window_bytes"] > 0].sort_values(["window_bytes", "category"], ascending=[False, True],
                                                        kind="stable")
    picks = window.head(ADVISED_CATEGORIES) if len(window) else \
        cats.sort_values(["bytes", "category"], ascending=[False, True], kind="stable").head(1)
    return [Advice("category", {"category": str(pick["category"]),
                                "bytes": int(pick["window_bytes"]) if len(window) else int(pick["bytes"]),
                                "in_window": bool(len(window)), "shortfall": shortfall})
            for _, pick in picks.iterrows()]


def _led_by_kept(advice: list[Advice], kept: KeptAcrossStep | None, shortfall: int) -> list[Advice]:
    """The category advice, led, where forward-pass blocks outlived a training step, by freeing them: a leak is
    fixed before anything is tuned, and its bytes are part of the categories the advice after it names."""
    if kept is None:
        return advice
    return [Advice("kept", {"kept": kept, "shortfall": shortfall}), *advice]


def _capacity_outside(capacity: int | None, reserved: int, free: int | None) -> int | None:
    """Memory outside the allocator at the failure: capacity − reserved − device free; None where unknown or where
    the figures contradict each other (a capacity below what the device reported reserved and free)."""
    if capacity is None or free is None or capacity < reserved + free:
        return None
    return capacity - reserved - free


class _PerDevice:
    """What every oom entry of a device shares, computed once per device (the end state's free blocks, the NVML
    join, the last block-changing entry) or once per situation (the estimated free gaps between two block
    changes): an engine that retries records hundreds of entries, each 12 ms when each recomputed them."""

    def __init__(self, snapshot: Snapshot, timeline: Timeline, nvml: pd.DataFrame | None) -> None:
        self.snapshot, self.timeline, self.nvml = snapshot, timeline, nvml
        self.end_free = functools.cache(functools.partial(_end_state_free, snapshot))
        self.splits = functools.cache(functools.partial(_split_segments, snapshot))
        self._joined: dict[int, pd.DataFrame] = {}
        self._changed: dict[int, np.ndarray] = {}
        self._estimated: dict[tuple[int, int], tuple[pd.DataFrame, int]] = {}

    def changed(self, device: int) -> np.ndarray:
        if device not in self._changed:
            self._changed[device] = _last_change(self.snapshot.trace(device).action)
        return self._changed[device]

    def situation(self, device: int, index: int) -> int:
        """The last entry at or before `index` that changed memory: entries that share it share a state."""
        return int(self.changed(device)[index])

    def exact(self, device: int, index: int) -> bool:
        """Whether no entry after `index` changed memory (the end state is the failure's)."""
        changed = self.changed(device)
        return not len(changed) or int(changed[-1]) <= index

    def estimated_free(self, device: int, index: int) -> tuple[pd.DataFrame, int]:
        key = (device, self.situation(device, index))
        if key not in self._estimated:
            self._estimated[key] = _estimated_free(self.snapshot, self.timeline[device], index)
        return self._estimated[key]

    def joined(self, device: int) -> pd.DataFrame:
        if device not in self._joined:
            assert self.nvml is not None
            self._joined[device] = join_samples(self.timeline[device], self.nvml)
        return self._joined[device]


def _one_oom(snapshot: Snapshot, timeline: Timeline, row: Any, cats: pd.DataFrame, nvml: pd.DataFrame | None,
             capacity: int | None, capacity_source: str, kept: KeptAcrossStep | None = None,
             shared: _PerDevice | None = None) -> OomVerdict:
    device, index = int(row.device), int(row.index)
    dt = timeline[device]
    request = int(row.size)
    stream = int(row.stream)
    device_free = None if row.device_free is None or pd.isna(row.device_free) else int(row.device_free)
    free_known = device_free if device_free is not None else 0
    settings = snapshot.allocator_settings or {}
    max_split = int(settings.get("max_split_size") or -1)
    pool = DEFAULT_POOL
    shared = shared or _PerDevice(snapshot, timeline, nvml)
    exact = shared.exact(device, index)
    if exact:
        free, in_blocks = shared.end_free(device)
        reserved = int(snapshot.segments["total_size"][snapshot.segments["device"] == device].sum())
        source = "end state (the oom entry is the last block-changing event)"
    else:
        free, in_blocks = shared.estimated_free(device, index)
        reserved = dt.reserved_at(index)
        source = "estimated from the replay (events after the oom entry changed memory)"
    reserved_free = reserved - in_blocks
    usable = _usable(free, request, stream, pool, max_split)
    largest = int(usable["size"].max()) if len(usable) else 0
    largest_any = int(free["size"].max()) if len(free) else 0
    active = dt.active_at(index)
    gives = reserved_free + free_known
    outside = _capacity_outside(capacity, reserved, device_free)
    if capacity is not None and device_free is not None and capacity < reserved + device_free:
        capacity_source = (f"{capacity_source}; inconsistent with the OOM entry: reserved + device free = "
                           f"{reserved + device_free:,} B exceeds it, so nothing outside the allocator is computed")
    outside_source = "capacity − reserved − device free at the failure" if outside is not None else None
    own = others = growth = gap_us = None
    if nvml is not None and len(nvml):
        joined = shared.joined(device)
        at = outside_at_instant(dt, joined, index, 0, what="the failure")
        if at["outside_bytes"] is not None:
            own, others = at["own_outside_bytes"], at["other_processes_bytes"]
            if outside is None:
                outside, outside_source = int(at["outside_bytes"]), f"NVML ({at['basis']})"
            known = joined["outside_bytes"].dropna()
            if len(known):
                growth = int(at["outside_bytes"]) - int(known.min())
            sample = at["sample_before_us"] if at["sample_before_us"] is not None else at["sample_after_us"]
            if sample is not None and at["time_us"] is not None:
                gap_us = int(at["time_us"]) - int(sample)
    splits = shared.splits(device) if exact else pd.DataFrame(columns=["segment_size"])
    kind = "small" if request <= SMALL_SIZE else "large"
    shortfall = max(0, request - gives)
    advice: list[Advice] = []
    pressure = pressure_bytes = None
    if largest >= request:
        verdict = "unexplained"
    elif request <= gives:
        verdict = "fragmentation"
        if not settings.get("expandable_segments"):
            advice.append(Advice("expandable_segments", {"reserved_free_bytes": reserved_free,
                                                         "largest_free_bytes": largest_any}))
        if len(splits) and max_split <= 0:
            smallest = int(splits["segment_size"].min()) // MiB
            advice.append(Advice("max_split", {"split_mb": max(20, 1 << (max(smallest, 1).bit_length() - 1)),
                                               "segments": len(splits),
                                               "free_bytes": int(splits["free_bytes"].sum())}))
        advice = [_needing_torch(snapshot, a) for a in advice]
    else:
        found = [(v, name) for v, name in ((others, "other_processes"), (growth, "outside_growth"))
                 if v is not None and v >= shortfall and v > 0]
        if found:
            verdict = "outside_pressure"
            pressure_bytes, pressure = found[0]
            advice.append(Advice("isolate"))
        else:
            verdict = "live_exhaustion"
            advice.extend(_led_by_kept(_advice_for_categories(cats, shortfall), kept, shortfall))
            advice.append(Advice("free_live", {"bytes": shortfall}))
    return OomVerdict(
        device=device, index=index, time_us=None if pd.isna(row.time_us) else int(row.time_us), stream=stream,
        request_bytes=request, device_free_bytes=device_free, active_bytes=active, allocated_bytes=in_blocks,
        reserved_bytes=reserved, reserved_free_bytes=reserved_free, largest_free_block_bytes=largest,
        largest_free_block_any_bytes=largest_any, free_blocks=len(free), pool=pool, segment_type=kind, exact=exact,
        state_source=source, capacity_bytes=capacity,
        capacity_source=capacity_source if capacity is not None else UNKNOWN_CAPACITY, outside_bytes=outside,
        outside_source=outside_source, own_outside_bytes=own, other_processes_bytes=others,
        outside_growth_bytes=growth, shortfall_bytes=shortfall, split_segments=len(splits), verdict=verdict,
        pressure=pressure, pressure_bytes=pressure_bytes, sample_gap_us=gap_us, advice=tuple(advice), kept=kept)


def _categories(snapshot: Snapshot, timeline: Timeline, device: int, index: int, rules: RuleSet | None,
                markers: pd.DataFrame | None, attribution_at: AttributionAt | None = None
                ) -> tuple[pd.DataFrame, pd.DataFrame, Attribution]:
    """The categories live at the entry, the device's live blocks there (`Attribution.blocks`) and their
    attribution."""
    result = attribution_at(device, int(index)) if attribution_at is not None else attribute(
        snapshot, at=int(index), rules=rules, device=device, timeline=timeline, markers=markers)
    b = result.blocks
    b = b[b["device"] == device]
    total = int(b["size"].sum())
    g = b.assign(window=np.where(b["alloc_index"] >= 0, b["size"], 0)).groupby("category", sort=False).agg(
        bytes=("size", "sum"), blocks=("size", "size"), window_bytes=("window", "sum")).reset_index()
    g["share"] = g["bytes"] / total if total else 0.0
    g.insert(0, "index", index)
    g.insert(0, "device", device)
    return g.sort_values(["bytes", "category"], ascending=[False, True], kind="stable")[CATEGORY_COLUMNS], b, result


def rejected_requests(markers: pd.DataFrame | None) -> pd.DataFrame:
    """Request markers the engine marked refused: attrs `rejected` truthy or `status` rejected/refused/aborted."""
    if markers is None or not len(markers):
        return pd.DataFrame(columns=["name", "time_us", "reason"])
    rows = []
    for m in markers.itertuples(index=False):
        attrs = m.attrs if isinstance(m.attrs, dict) else {}
        status = str(attrs.get("status", "")).lower()
        if m.kind == "request" and (bool(attrs.get("rejected")) or status in ("rejected", "refused", "aborted")):
            reason = attrs.get("reason") or attrs.get("error") or ""
            rows.append({"name": str(m.name), "time_us": int(m.start_time_us), "reason": str(reason)})
    return pd.DataFrame(rows, columns=["name", "time_us", "reason"])


def _state_only(snapshot: Snapshot, device: int) -> StateOnly:
    free, in_blocks = _end_state_free(snapshot, device)
    segs = snapshot.segments
    reserved = int(segs["total_size"][segs["device"] == device].sum())
    blocks = snapshot.blocks
    live = blocks[(blocks["device"] == device) & blocks["state"].isin(ACTIVE_STATES)]
    largest = int(free["size"].max()) if len(free) else 0
    stream = int(free.loc[free["size"].idxmax(), "stream"]) if len(free) else None
    return StateOnly(device=device, reserved_bytes=reserved, allocated_bytes=in_blocks,
                     reserved_free_bytes=reserved - in_blocks, free_blocks=len(free), largest_free_block_bytes=largest,
                     largest_free_stream=stream, live_blocks=len(live),
                     larger_live_blocks=int((live["size"] > largest).sum()))


def _no_oom(dt: DeviceTimeline, nvml: pd.DataFrame | None, capacity: int | None, capacity_source: str,
            rejected: pd.DataFrame, admission: bool = False) -> NoOom:
    index = global_peak_index(dt)
    active, reserved = dt.active_at(index), dt.reserved_at(index)
    used = None
    basis = "allocator reserved only; without NVML samples, memory outside the allocator is unknown"
    if nvml is not None and len(nvml):
        at = outside_at_instant(dt, join_samples(dt, nvml), index, None)
        if at["nvml_used_bytes"] is not None:
            used = int(at["nvml_used_bytes"])
            basis = ("NVML used at the peak" if at["nvml_used_measured"] else
                     "reserved at the peak + memory outside the allocator from the NVML samples around it, an "
                     "estimate: no sample fell inside the peak")
    held = used if used is not None else reserved
    over = capacity is not None and held > capacity
    return NoOom(device=dt.device, peak_index=index, peak_time_us=dt.time_at(index), active_bytes=active,
                 reserved_bytes=reserved, nvml_used_bytes=used, peak_basis=basis, capacity_bytes=capacity,
                 capacity_source=capacity_source if capacity is not None else "unknown",
                 headroom_bytes=capacity - held if capacity is not None and not over else None,
                 rejected_requests=tuple(rejected.to_dict("records")), admission=admission or bool(len(rejected)),
                 contradiction_bytes=held - capacity if capacity is not None and over else None)


def explain_oom(snapshot: Snapshot, timeline: Timeline | None = None, *, nvml: pd.DataFrame | None = None,
                capacity: int | Mapping[int, tuple[int | None, str]] | None = None,
                markers: pd.DataFrame | None = None, rules: RuleSet | None = None,
                attribution_at: AttributionAt | None = None) -> OomExplanation:
    """Explain every `oom` entry of `snapshot` (see the module docstring).

    `nvml`: the rank's NVML rows (`load.samples`); `capacity`: the device total in bytes for every device,
    or per device (bytes, where it came from), else the NVML total; `markers`: the rank's markers (for
    rejected requests); `attribution_at(device, index)`: attributions the caller keeps (made with the same
    rules and markers), used instead of attributing each entry again."""
    timeline = timeline or replay(snapshot)

    def cap(device: int) -> tuple[int | None, str]:
        if isinstance(capacity, int):
            return capacity, "given"
        if capacity is not None and capacity.get(device, (None, ""))[0] is not None:
            return capacity[device]
        if nvml is not None and len(nvml) and (nvml["device"] == device).any():
            return int(nvml[nvml["device"] == device]["total_bytes"].iloc[-1]), "NVML total"
        return None, "unknown"

    ooms = snapshot.ooms
    rows, cats, live = [], [], []
    per_forward = (rules or shipped_rules()).per_forward
    # Entries in one situation share their analysis: an engine that retries records hundreds of oom entries with
    # no allocation or free between them, and the live blocks, their categories and what was kept are the same.
    shared = _PerDevice(snapshot, timeline, nvml)
    situations: dict[tuple[int, int], tuple[pd.DataFrame, pd.DataFrame, Attribution, KeptAcrossStep | None]] = {}
    for row in ooms.itertuples(index=False):
        device, index = int(row.device), int(row.index)
        key = (device, shared.situation(device, index))
        if key not in situations:
            c, blocks, at = _categories(snapshot, timeline, device, index, rules, markers, attribution_at)
            situations[key] = (c, blocks, at, kept_across_step(at, device, index, per_forward))
        c, blocks, at, kept = situations[key]
        c = c.assign(index=index)
        cats.append(c)
        live.append(blocks[["stack_id", "category", "size"]])
        total, source = cap(device)
        rows.append(dataclasses.replace(
            _one_oom(snapshot, timeline, row, c, nvml, total, source, kept, shared),
            failed=failed_allocation(snapshot, device, index, rules, markers)))
    rows = _simulated(snapshot, timeline, rows)
    table = pd.DataFrame([v.record() for v in rows], columns=OOM_COLUMNS)
    for c in ("time_us", "device_free_bytes", "capacity_bytes", "outside_bytes", "own_outside_bytes",
              "other_processes_bytes", "outside_growth_bytes"):
        table[c] = table[c].astype("Int64")
    categories = pd.concat(cats, ignore_index=True) if cats else pd.DataFrame(columns=CATEGORY_COLUMNS)
    no_oom: tuple[NoOom, ...] = ()
    notes = []
    # a device with a state and at most one trace entry (a legacy dump) has no trace to see a failure in, unless
    # that entry is the failure
    failed = set(ooms["device"].tolist()) if len(ooms) else set()
    traced = [d for d in sorted(timeline.devices) if len(timeline[d]) > 1 or d in failed]
    state_only = tuple(_state_only(snapshot, d) for d in sorted(timeline.devices) if d not in traced)
    # the program: from the blocks live at the failures, else (nothing failed) from every allocation's stack
    engine = detect_program(snapshot, pd.concat(live, ignore_index=True) if live else
                            pd.DataFrame({"stack_id": snapshot.allocation_stack_ids()}))
    if not len(ooms):
        rejected = rejected_requests(markers)
        serving = engine.name in SERVING_ENGINES
        no_oom = tuple(_no_oom(timeline[d], nvml, *cap(d), rejected, serving) for d in traced)
    if not timeline.devices:
        notes.append("the file holds no allocator state and no trace (no segments, no trace entries): there is no "
                     "allocation, failed or not, to explain")
    if (table["exact"] == False).any():  # noqa: E712 - pandas element-wise comparison
        notes.append("estimated: events after an oom entry changed memory, so its free blocks are laid out from the "
                     "replay (live blocks at the entry, rounded sizes), not read from the end state")
    return OomExplanation(snapshot=snapshot, timeline=timeline, ooms=table, categories=categories,
                          verdicts=tuple(rows), no_oom=no_oom, notes=tuple(notes), engine=engine,
                          state_only=state_only)


ALLOCATOR_ADVICE = {"expandable_segments": lambda x: "expandable_segments:True",
                    "max_split": lambda x: f"max_split_size_mb:{x['split_mb']}"}


def _needing_torch(snapshot: Snapshot, a: Advice) -> Advice:
    """An allocator setting's advice, with `needs_torch` (the release it appeared in, the file's inferred torch,
    whether that is surely older) where the torch that wrote the file may not have it."""
    from ..allocator.settings import of_snapshot, with_changes
    from .whatif import newer_torch_needed

    recorded = of_snapshot(snapshot.allocator_settings)
    needs = newer_torch_needed(snapshot, recorded, with_changes(recorded, [ALLOCATOR_ADVICE[a.kind](a.values)]))
    return Advice(a.kind, {**a.values, "needs_torch": dataclasses.asdict(needs[0])}) if needs else a


def _simulated(snapshot: Snapshot, timeline: Timeline, verdicts: list[OomVerdict]) -> list[OomVerdict]:
    """Each allocator setting advised for an OOM, tried: the trace's requests replayed through the allocator
    simulator under that setting on the device PyTorch had at that OOM (reserved + the driver's free bytes).
    Its Advice gains `simulated`: whether the failed request is served, reserved after it under the recorded
    settings and under the advised one, and whether a replay under the recorded settings reproduced the trace
    up to that OOM (when it does not, the prediction is less sure, and says so)."""
    from ..allocator.settings import of_snapshot, with_changes
    from .trace_replay import predict_device, replay_device, start_state

    out = []
    starts: dict[int, Any] = {}
    recorded = of_snapshot(snapshot.allocator_settings)
    for v in verdicts:
        if not any(a.kind in ALLOCATOR_ADVICE for a in v.advice) or v.device_free_bytes is None:
            out.append(v)
            continue
        device = v.device
        if device not in starts:
            start = start_state(snapshot, timeline, device)
            r = replay_device(snapshot, timeline, device, start=start)
            starts[device] = (start, r)
        start, r = starts[device]
        agrees = r.first_divergence is None or r.first_divergence.index >= v.index
        capacity = timeline[device].reserved_at(v.index) + v.device_free_bytes
        # the recorded settings: the replay's own figures where it reproduced the trace up to this OOM
        base = r.observed if agrees else predict_device(snapshot, timeline, device, recorded, capacity, start=start)
        before = next((o for o in base.ooms if o.index == v.index), None)
        advice = []
        for a in v.advice:
            if a.kind in ALLOCATOR_ADVICE:
                setting = ALLOCATOR_ADVICE[a.kind](a.values)
                p = predict_device(snapshot, timeline, device, with_changes(recorded, [setting]), capacity,
                                   start=start)
                at = next((o for o in p.ooms if o.index == v.index), None)
                simulated = {"setting": setting, "reached": at is not None,
                             "served": bool(at is not None and at.served),
                             "reserved_recorded": before.reserved if before is not None else None,
                             "reserved": at.reserved if at is not None else None,
                             "largest_free": at.largest_free if at is not None else None,
                             "stopped_at": p.stop.index if p.stop is not None and at is None else None,
                             "replay_agrees": agrees}
                a = Advice(a.kind, {**a.values, "simulated": simulated})
            advice.append(a)
        out.append(dataclasses.replace(v, advice=tuple(advice)))
    return out


@dataclass(frozen=True, eq=False)
class SnapshotOoms:
    """The explanation of one snapshot of a run (or of a lone file: rank and tag None)."""

    rank: int | None
    tag: str | None
    path: Path
    explanation: OomExplanation
