"""Measure a sweep over batch shapes: baseline, peak and transient per shape, and per category.

Contract: a sweep is a list of `SweepPoint`s, each one snapshot window (a whole trace, or one phase span of
it) with its shape (`batch_shape`; `points_from_phases` makes the points of a snapshot's shaped phases).
`measure_sweep(points)` replays each window and reports the baseline (active bytes when the window began),
the peak (the window's maximum of active bytes) and the transient (peak − baseline); per category, and per
family of related categories (`FAMILIES`), the bytes live at the peak (exactly as `attribute` labels them:
they sum to the peak), the bytes live when the window began, and the transient high-water mark (the most
bytes of that category allocated inside the window and live at once). Bytes are requested bytes, exact from
the replay. Fitting the sweep is `capacity`.

DataFrame columns:
- `Sweep.shapes`: label, source, phase, device, tokens, batch, chunk, images (nullable ints), any extra
  manifest columns, first_index, last_index, peak_event_index, peak_time_us, baseline_bytes, peak_bytes,
  transient_bytes, reserved_bytes (at the peak), max_reserved_bytes (over the window).
- `Sweep.categories`: label, target, kind ("category" | "family"), baseline_bytes, peak_bytes,
  transient_bytes (in-window high-water), max_bytes (high-water of everything live, baseline included).

`measure_sweep` is `measure_points` (each point's rows, a `MeasuredPoint`: small, no snapshot, so a worker
process can measure the points of its input and send them back) then `assemble_sweep` (the tables, in the
order of the points given, each row labelled with its point's label).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from ..batch_shape import SHAPE_KEYS, attrs_shape, shape_from_filename
from ..errors import UsageError
from ..model import Snapshot
from ..replay import DeviceTimeline, Timeline, replay
from .attribute import attribute, label_lifetimes
from .outside import join_samples, outside_at_instant
from .phases import phase_spans, window_bounds, window_peak
from .rules import RuleSet, shipped_rules

# Families of categories whose bytes are one thing under different labels (materialised attention scores
# are `attention` or `fallback_kernel` depending on which signal decided); jumps and fits consider the sum.
FAMILIES: dict[str, tuple[str, ...]] = {"attention_related": ("attention", "fallback_kernel")}

SHAPE_COLUMNS = ["label", "source", "phase", "device", *SHAPE_KEYS]
MEASURE_COLUMNS = ["first_index", "last_index", "peak_event_index", "peak_time_us", "baseline_bytes", "peak_bytes",
                   "transient_bytes", "reserved_bytes", "max_reserved_bytes", "outside_bytes", "outside_measured"]
CATEGORY_COLUMNS = ["label", "target", "kind", "baseline_bytes", "peak_bytes", "transient_bytes", "max_bytes"]
LEVEL_COLUMNS = ["target", "baseline_bytes", "transient_bytes", "max_bytes"]


@dataclass(frozen=True, eq=False)
class SweepPoint:
    """One measured shape: a snapshot window (µs bounds; None = open) and the shape it ran."""

    label: str
    source: str
    shape: dict[str, Any]
    snapshot: Snapshot
    window: tuple[int | None, int | None] = (None, None)
    phase: str | None = None
    nvml: pd.DataFrame | None = None        # the rank's NVML samples (a run's input), for memory outside



P = TypeVar("P", SweepPoint, "MeasuredPoint")


def _phase_keys(names: Sequence[str]) -> list[str]:
    counts: dict[str, int] = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    seen: dict[str, int] = {}
    keys = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        keys.append(n if counts[n] == 1 else f"{n}#{seen[n]}")
    return keys



def points_from_phases(label: str, source: str, snapshot: Snapshot, markers: pd.DataFrame) -> list[SweepPoint]:
    """The points of a snapshot's shaped phases: the collector's phase markers whose attrs carry a shape, or
    without markers, the `record_function` spans whose names carry one (e.g. `prefill tokens=4096`)."""
    phases = markers[markers["kind"] == "phase"].reset_index(drop=True) if len(markers) else markers
    points = []
    if len(phases):
        for key, row in zip(_phase_keys(list(phases["name"])), phases.itertuples()):
            shape = attrs_shape(f"{source}: phase {key}", row.attrs)
            if shape:
                end = None if pd.isna(row.end_time_us) else int(row.end_time_us)
                points.append(SweepPoint(f"{label}:{key}", source, shape, snapshot, (int(row.start_time_us), end),
                                         key))
        return points
    for row in phase_spans(snapshot).itertuples():
        shape = shape_from_filename(row.name)
        if shape:
            start = None if pd.isna(row.start_us) else int(row.start_us)
            end = None if pd.isna(row.end_us) else int(row.end_us)
            points.append(SweepPoint(f"{label}:{row.phase}", source, shape, snapshot, (start, end), row.phase))
    return points


def order_points(points: Sequence[P]) -> list[P]:
    """Points sorted by shape (unknown last), then label; labels made unique by source when two collide.
    (SweepPoints, or MeasuredPoints: the same points measured in workers.)"""
    import dataclasses

    def order(pt: P) -> tuple[Any, ...]:
        return tuple((pt.shape.get(k) is None, pt.shape.get(k) or 0) for k in SHAPE_KEYS) + (pt.label,)

    labels = [pt.label for pt in points]
    if len(set(labels)) != len(labels):
        points = [dataclasses.replace(pt, label=pt.source if pt.phase is None else f"{pt.source}:{pt.phase}")
                  for pt in points]
    return sorted(points, key=order)


# ---------------------------------------------------------------------------------------------------------
# Every lifetime labelled, and category levels over a window
# ---------------------------------------------------------------------------------------------------------

def label_window(snapshot: Snapshot, timeline: Timeline, device: int, rules: RuleSet | None = None,
                 first: int = 0, last: int | None = None) -> pd.DataFrame:
    """The block lifetimes of `device` live at some point of events [first, last] (default: the whole
    trace), in `DeviceTimeline.lifetimes` order, with a `category` column, all labelled at once
    (`attribute.label_lifetimes`), with the same rules, signals and heuristics as at a peak.

    Context-dependent signals (the main request, the attention-score floor, vocabulary and MLP size hints)
    are taken over those lifetimes together rather than one instant, so a block's label can differ from
    `attribute` at an instant in rare cases; `attribute` stays the reference for what was live at a peak."""
    dt = timeline[device]
    last = len(dt) - 1 if last is None else last
    lt = dt.lifetimes
    free = lt["free_index"].to_numpy()
    lt = lt[(lt["alloc_index"].to_numpy() <= last) & ((free < 0) | (free >= first))].reset_index(drop=True)
    if len(lt) == 0:
        return lt.assign(category=pd.Series([], dtype=object))
    labelled = label_lifetimes(snapshot, device, lt, rules)
    return lt.assign(category=labelled["category"].to_numpy())


def category_levels(labelled: pd.DataFrame, first: int, last: int, groups: dict[str, str] | None = None) \
        -> pd.DataFrame:
    """Per target (category, or `groups[category]` when given; unmapped categories are skipped) over the
    window of events [first, last]: bytes live just before `first` (baseline_bytes), the high-water mark of
    bytes allocated inside the window (transient_bytes) and of everything live (max_bytes).
    Columns: target, baseline_bytes, transient_bytes, max_bytes."""
    cats = labelled["category"].astype(str).to_numpy()
    targets = np.array([groups.get(c) if groups is not None else c for c in cats], dtype=object)
    alloc = labelled["alloc_index"].to_numpy()
    free = labelled["free_index"].to_numpy()
    size = labelled["size"].to_numpy().astype(np.int64)
    width = max(last - first + 1, 0)
    before = first - 1
    live_before = (alloc <= before) & ((free < 0) | (free > before))
    inside = (alloc >= first) & (alloc <= last)
    rows = []
    for target in sorted({t for t in targets.tolist() if t is not None}):
        mine = targets == target
        base = int(size[mine & live_before].sum())
        grow = np.zeros(width + 1, dtype=np.int64)     # position 0 = before the window, p = event first + p − 1
        fall = np.zeros(width + 1, dtype=np.int64)
        new = mine & inside
        np.add.at(grow, alloc[new] - first + 1, size[new])
        ends = new & (free >= 0) & (free <= last)
        np.add.at(grow, free[ends] - first + 1, -size[ends])
        gone = mine & live_before & (free >= first) & (free <= last)
        np.add.at(fall, free[gone] - first + 1, -size[gone])
        transient = np.cumsum(grow)
        level = base + transient + np.cumsum(fall)
        if not base and not new.any():
            continue
        rows.append({"target": target, "baseline_bytes": base, "transient_bytes": int(max(transient.max(), 0)),
                     "max_bytes": int(level.max())})
    return pd.DataFrame(rows, columns=LEVEL_COLUMNS)


# ---------------------------------------------------------------------------------------------------------
# Measuring the sweep
# ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Sweep:
    """The measured sweep: one row per point (`shapes`) and per point × target (`categories`)."""

    points: tuple[SweepPoint, ...] | tuple[MeasuredPoint, ...]   # MeasuredPoint: measured in a worker
    shapes: pd.DataFrame
    categories: pd.DataFrame
    notes: tuple[str, ...] = ()


def _pick_device(timeline: Timeline, device: int | None, source: str) -> int:
    if device is not None:
        if device not in timeline.devices:
            raise UsageError(f"{source}: no device {device} (devices: {sorted(timeline.devices)})")
        return device
    if not timeline.devices:
        raise UsageError(f"{source}: no devices (no segments and no trace)")
    def peak(d: int) -> int:
        return int(np.max(timeline[d].active, initial=timeline[d].baseline_active))

    return max(sorted(timeline.devices), key=peak)


@dataclass(frozen=True, eq=False)
class MeasuredPoint:
    """A point measured where its snapshot was (a worker process): the point without its snapshot, and its
    rows — `row` for `Sweep.shapes`, `categories` for `Sweep.categories` (labels are set when assembled)."""

    label: str
    source: str
    shape: dict[str, Any]
    window: tuple[int | None, int | None]
    phase: str | None
    row: dict[str, Any]
    categories: tuple[dict[str, Any], ...]


def measure_points(points: Sequence[SweepPoint], rules: RuleSet | None = None, device: int | None = None
                   ) -> list[MeasuredPoint]:
    """Each point measured (see the module docstring), in order; points of one snapshot share its replay."""
    rules = rules or shipped_rules()
    replays: dict[int, Timeline] = {}
    labels: dict[tuple[int, int, int, int], pd.DataFrame] = {}
    family_of = {c: fam for fam, members in FAMILIES.items() for c in members}
    out = []
    for pt in points:
        snap = pt.snapshot
        timeline = replays.get(id(snap))
        if timeline is None:
            timeline = replays[id(snap)] = replay(snap)
        d = _pick_device(timeline, device, pt.source)
        dt = timeline[d]
        first, last = window_bounds(dt, *pt.window) if pt.window != (None, None) else (0, len(dt) - 1)
        peak = window_peak(dt, first, last)
        index = peak.event_index
        result = attribute(snap, at=int(index), rules=rules, device=d, timeline=timeline)
        at_peak = result.summary.set_index("category")["bytes"].to_dict()
        key = (id(snap), d, first, last)
        if key not in labels:
            labels[key] = label_window(snap, timeline, d, rules, first, last)
        levels = category_levels(labels[key], first, last)
        fam_levels = category_levels(labels[key], first, last, family_of)
        reserved = dt.reserved[first:last + 1] if last >= first else np.zeros(0, dtype=np.int64)
        row = {                                     # the shape goes in when assembled
            "source": pt.source, "phase": pt.phase, "device": d,
            "first_index": first, "last_index": last, "peak_event_index": index, "peak_time_us": peak.time_us,
            "baseline_bytes": peak.baseline_active_bytes, "peak_bytes": peak.active_bytes,
            "transient_bytes": peak.transient_bytes, "reserved_bytes": peak.reserved_bytes,
            "max_reserved_bytes": int(max(np.max(reserved, initial=0), dt.reserved_at(first - 1))),
            **_outside(dt, int(index), pt.nvml),
        }
        cat_rows = []
        seen = set()
        for kind, table in (("category", levels), ("family", fam_levels)):
            for r in table.itertuples():
                members = FAMILIES.get(r.target, (r.target,))
                cat_rows.append({"label": pt.label, "target": r.target, "kind": kind,
                                 "baseline_bytes": int(r.baseline_bytes),
                                 "peak_bytes": int(sum(at_peak.get(m, 0) for m in members)),
                                 "transient_bytes": int(r.transient_bytes), "max_bytes": int(r.max_bytes)})
                seen.add(r.target)
        for category, nbytes in at_peak.items():   # live at the peak but labelled otherwise over the window
            if category not in seen:
                cat_rows.append({"label": pt.label, "target": category, "kind": "category", "baseline_bytes": 0,
                                 "peak_bytes": int(nbytes), "transient_bytes": 0, "max_bytes": int(nbytes)})
        out.append(MeasuredPoint(pt.label, pt.source, dict(pt.shape), pt.window, pt.phase, row, tuple(cat_rows)))
    return out


def _outside(dt: DeviceTimeline, index: int, nvml: pd.DataFrame | None) -> dict[str, Any]:
    """Memory outside the allocator at the peak from the rank's NVML samples (everything on the device beyond
    the allocator's reserved bytes: CUDA context, NCCL, libraries, other processes): `outside_bytes` (None: no
    sample near it), `outside_measured` (a sample fell while the peak held)."""
    if nvml is None or not len(nvml) or index < 0:
        return {"outside_bytes": None, "outside_measured": False}
    later = np.flatnonzero(dt.active[index + 1:] != dt.active[index])
    until = dt.time_at(index + 1 + int(later[0])) if len(later) else None
    start = dt.time_at(index)
    held = until - start if until is not None and start is not None else None
    at = outside_at_instant(dt, join_samples(dt, nvml), index, held)
    return {"outside_bytes": at["outside_bytes"], "outside_measured": bool(at["nvml_used_measured"])}


def assemble_sweep(measured: Sequence[MeasuredPoint], points: Sequence[SweepPoint] | None = None) -> Sweep:
    """The Sweep of points measured (in the order given, each row labelled with its point's label, which
    `order_points` may have made unique); `points`: the same points with their snapshots, when here."""
    if not measured:
        raise UsageError("capacity: the sweep has no points")
    extra_keys = list(dict.fromkeys(k for m in measured for k in m.shape if k not in SHAPE_KEYS))
    place = ("source", "phase", "device")
    shape_rows = [{"label": m.label, **{k: m.row[k] for k in place}, **{k: m.shape.get(k) for k in SHAPE_KEYS},
                   **{k: m.shape.get(k) for k in extra_keys}, **{k: m.row[k] for k in MEASURE_COLUMNS}}
                  for m in measured]
    cat_rows = [{**r, "label": m.label} for m in measured for r in m.categories]
    shapes = pd.DataFrame(shape_rows, columns=SHAPE_COLUMNS + extra_keys + MEASURE_COLUMNS)
    for k in SHAPE_KEYS:
        shapes[k] = shapes[k].astype("Int64")
    shapes["peak_time_us"] = shapes["peak_time_us"].astype("Int64")
    shapes["outside_bytes"] = shapes["outside_bytes"].astype("Int64")
    shapes["outside_measured"] = shapes["outside_measured"].astype(bool)
    kept: tuple[SweepPoint, ...] | tuple[MeasuredPoint, ...] = tuple(points) if points is not None else tuple(measured)
    return Sweep(points=kept, shapes=shapes,
                 categories=pd.DataFrame(cat_rows, columns=CATEGORY_COLUMNS), notes=())


def measure_sweep(points: Sequence[SweepPoint], rules: RuleSet | None = None, device: int | None = None) -> Sweep:
    """Baseline, peak, transient and per-category bytes of every point (see the module docstring)."""
    if not points:
        raise UsageError("capacity: the sweep has no points")
    return assemble_sweep(measure_points(points, rules, device), points)
