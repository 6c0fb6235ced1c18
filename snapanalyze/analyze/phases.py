"""Phases: what each marked span of the workload (a prefill, a request, a record_function) did to memory.

Contract: `spans(snapshot, markers)` lists the spans a run recorded, from three sources: the collector's
markers (`load.samples`: kind "phase" or "request", µs bounds), the snapshot's `record_function`
annotations (START/END pairs by name; the collector's own "phase:<name>" annotations are dropped when the
markers hold that phase) and `user_metadata` (the events that carried one value, e.g. "req=A"; dropped when
a request marker of that id exists). `phase_table(snapshot, …)` maps each span onto each device's trace and
reports before (active bytes just before it began), peak (highest active bytes inside it), after (active
bytes when it ended), the transient (peak − before), what it left behind (after − before) and, optionally,
its top categories: the bytes allocated inside the span and still live at its peak, attributed. A span that
began before the trace window's first event is `clipped` (its before is the window's start: the ring buffer
may have dropped its first events); one without an end (still running when the markers were written, e.g.
a process killed by its OOM) is `open` and runs to the last event.
Names: every span has one `label`, the name `phases` prints and every `--phase` accepts (`attribute`,
`diff`, the report): its name when that name occurs once among the spans of its kind on its device (the
rank's, for markers), else ``NAME#K`` for its K-th occurrence (`phase_label`). `find_phase(table, name)`
resolves what a user wrote: a label, a bare name (all its occurrences), or NAME#K / "NAME #K".
`phase_instant` picks the instant `attribute --phase NAME` attributes: the highest active bytes inside the
phase (across its occurrences, or the one named). `phase_spans(snapshot)` names the `record_function`
spans of one snapshot alone for the sweep (a repeated name becomes "name#k"; PHASE_SPAN_COLUMNS).

`spans` columns: phase, occurrence (1-based, per phase name, kind and device), label, kind ("phase" |
"request" | "annotation" | "metadata"), source ("markers" | "annotations" | "user_metadata"), device
(nullable: markers span every device of the rank), start_us, end_us (nullable: open, or before the window),
depth, attrs. `phase_table` columns: PHASE_COLUMNS.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any

import numpy as np
import pandas as pd

from ..errors import UsageError
from ..model import ANNOTATE, Snapshot
from ..replay import DeviceTimeline, Timeline, replay
from .attribute import Attribution, attribute
from .attribute.result import AttributionAt
from .rules import RuleSet, shipped_rules
from .spans import annotation_spans

PHASE_SPAN_COLUMNS = ["phase", "name", "occurrence", "start_us", "end_us"]
SPAN_COLUMNS = ["phase", "occurrence", "label", "kind", "source", "device", "start_us", "end_us", "depth", "attrs"]
PHASE_COLUMNS = ["device", "phase", "occurrence", "label", "kind", "source", "start_us", "end_us", "clipped", "open",
                 "start_index", "end_index", "before_bytes", "peak_bytes", "peak_index", "peak_time_us",
                 "after_bytes", "transient_bytes", "retained_bytes", "reserved_peak_bytes", "top_categories",
                 "top_category_bytes", "top_category_inferred_bytes", "attrs"]
PHASE_PREFIX = "phase:"   # the collector annotates collect.phase("x") as record_function "phase:x"


def _metadata_spans(snapshot: Snapshot) -> list[dict[str, Any]]:
    out = []
    for device in sorted(snapshot.traces):
        t = snapshot.traces[device]
        if t.user_metadata is None or not any(t.user_metadata_names):
            continue
        for code, value in enumerate(t.user_metadata_names):
            if not value:
                continue
            idx = np.flatnonzero((t.user_metadata == code) & (t.action != ANNOTATE))  # annotate: a block's label
            if not len(idx):
                continue
            times = t.time_us
            out.append({"name": value, "device": device, "start_index": int(idx[0]), "end_index": int(idx[-1]),
                        "start_us": int(times[idx[0]]) if times is not None else None,
                        "end_us": int(times[idx[-1]]) if times is not None else None})
    return out


def spans(snapshot: Snapshot, markers: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every marked span (see the module docstring), in start order."""
    rows: list[dict[str, Any]] = []
    marker_phases: set[str] = set()
    marker_requests: set[str] = set()
    if markers is not None and len(markers):
        for m in markers.itertuples(index=False):
            if m.kind == "module":                # module spans label allocations (`modules`), not phases
                continue
            kind = "request" if m.kind == "request" else "phase"
            (marker_requests if kind == "request" else marker_phases).add(str(m.name))
            rows.append({"phase": str(m.name), "kind": kind, "source": "markers", "device": None,
                         "start_us": int(m.start_time_us),
                         "end_us": None if m.end_time_us is pd.NA else int(m.end_time_us),
                         "depth": int(m.depth), "attrs": dict(m.attrs) if isinstance(m.attrs, dict) else {}})
    for a in annotation_spans(snapshot):
        name = a["name"]
        if name.startswith(PHASE_PREFIX):
            if name[len(PHASE_PREFIX):] in marker_phases:
                continue
            name = name[len(PHASE_PREFIX):]
        rows.append({"phase": name, "kind": "annotation", "source": "annotations", "device": a["device"],
                     "start_us": a["start_us"], "end_us": a["end_us"], "depth": a["depth"], "attrs": {}})
    for s in _metadata_spans(snapshot):
        value = s["name"]
        if value.startswith("req=") and value[4:] in marker_requests:
            continue
        rows.append({"phase": value, "kind": "metadata", "source": "user_metadata", "device": s["device"],
                     "start_us": s["start_us"], "end_us": s["end_us"], "depth": 0,
                     "attrs": {"start_index": s["start_index"], "end_index": s["end_index"]}})
    df = pd.DataFrame(rows, columns=[c for c in SPAN_COLUMNS if c not in ("occurrence", "label")])
    for c in ("device", "start_us", "end_us"):
        df[c] = df[c].astype("Int64")
    df["depth"] = df["depth"].astype("int64")
    order = df["start_us"].fillna(np.iinfo(np.int64).min).to_numpy()
    df = df.iloc[np.argsort(order, kind="stable")].reset_index(drop=True)
    groups = df.groupby(["phase", "kind", "device"], sort=False, dropna=False)
    df.insert(1, "occurrence", (groups.cumcount() + 1).astype("int64"))
    repeated = (groups["phase"].transform("size") > 1).to_numpy()
    df.insert(2, "label", [phase_label(n, k, r) for n, k, r in zip(df["phase"], df["occurrence"], repeated)])
    return df


def phase_label(name: str, occurrence: int, repeated: bool) -> str:
    """The one name of a span (see the module docstring): NAME, or NAME#K when the name is repeated."""
    return f"{name}#{int(occurrence)}" if repeated else str(name)


def find_phase(table: pd.DataFrame, name: str, source: str = "") -> pd.DataFrame:
    """The rows of a `spans` or `phase_table` table that `name` names: the span labelled so, else every
    occurrence of a span called so, else NAME#K (or "NAME #K"): its K-th occurrence. Raises UsageError,
    listing the labels there are, when none matches."""
    for hits in (table[table["label"] == name], table[table["phase"] == name]):
        if len(hits):
            return hits
    base, sep, k = name.rpartition("#")
    if sep and base.strip() and k.strip().isdigit():
        hits = table[(table["phase"] == base.rstrip()) & (table["occurrence"] == int(k))]
        if len(hits):
            return hits
    known = sorted(set(table["label"]))
    shown = ", ".join(known[:20]) + (f" … ({len(known)} in all; `snapanalyze phases` lists them)"
                                     if len(known) > 20 else "")
    raise UsageError(f"{source + ': ' if source else ''}no phase {name!r} inside the trace window"
                     + (f" (phases: {shown})" if known else
                        " (no markers, record_function annotations or user_metadata spans found)"))


def _window(dt: DeviceTimeline, span: Any) -> tuple[int, int, bool] | None:
    """(start_index, end_index, clipped) of a span on one device's trace, or None when it misses the window."""
    n = len(dt)
    if span.source == "user_metadata":
        return int(span.attrs["start_index"]), int(span.attrs["end_index"]), False
    if dt.time_us is None or n == 0:
        return None
    first, last = int(dt.time_us[0]), int(dt.time_us[-1])
    start = None if span.start_us is pd.NA else int(span.start_us)
    end = None if span.end_us is pd.NA else int(span.end_us)
    if (start is not None and start > last) or (end is not None and end < first):
        return None
    lo, hi = window_bounds(dt, start, end)
    return lo, hi, start is None or start < first


def window_bounds(dt: DeviceTimeline, start_us: int | None, end_us: int | None) -> tuple[int, int]:
    """(first, last) event indices of `dt` with start_us ≤ time ≤ end_us (None: open); first > last when
    no event falls inside. Raises UsageError when the trace has no timestamps."""
    n = len(dt)
    if start_us is None and end_us is None:
        return 0, n - 1
    if dt.time_us is None:
        raise UsageError(f"device {dt.device}: the trace has no timestamps, so phases cannot be located in it")
    first = 0 if start_us is None else int(np.searchsorted(dt.time_us, start_us, side="left"))
    last = n - 1 if end_us is None else int(np.searchsorted(dt.time_us, end_us, side="right")) - 1
    return first, last


@dataclasses.dataclass(frozen=True)
class WindowPeak:
    """The highest active bytes within a window of events, against the active bytes just before it."""

    first_index: int                # the window's first event
    event_index: int                # first_index − 1 when nothing rose above the baseline
    time_us: int | None
    active_bytes: int
    baseline_active_bytes: int
    reserved_bytes: int

    @property
    def transient_bytes(self) -> int:
        return self.active_bytes - self.baseline_active_bytes


def window_peak(dt: DeviceTimeline, first: int, last: int) -> WindowPeak:
    """The highest active bytes within events [first, last] (first occurrence), against the baseline: the
    active bytes just before `first`."""
    base = dt.active_at(first - 1)
    index = first - 1
    if last >= first:
        i = int(np.argmax(dt.active[first:last + 1]))
        if int(dt.active[first + i]) > base:
            index = first + i
    return WindowPeak(first, index, dt.time_at(index), dt.active_at(index), base, dt.reserved_at(index))


def _measure(dt: DeviceTimeline, lo: int, hi: int) -> dict[str, int]:
    before = dt.active_at(lo - 1)
    if hi >= lo:
        seg = dt.active[lo:hi + 1]
        k = int(np.argmax(seg))
        peak, peak_index = int(seg[k]), lo + k
        if peak <= before:
            peak, peak_index = before, lo - 1
        reserved_peak = max(int(dt.reserved[lo:hi + 1].max()), dt.reserved_at(lo - 1))
    else:
        peak, peak_index, reserved_peak = before, lo - 1, dt.reserved_at(lo - 1)
    after = dt.active_at(hi) if hi >= lo else before
    return {"before_bytes": before, "peak_bytes": peak, "peak_index": peak_index, "after_bytes": after,
            "transient_bytes": peak - before, "retained_bytes": after - before, "reserved_peak_bytes": reserved_peak}


def _top_categories(snapshot: Snapshot, timeline: Timeline, device: int, lo: int, peak_index: int,
                    rules: RuleSet | None, top: int, markers: pd.DataFrame | None,
                    attribution_at: AttributionAt | None = None) -> tuple[list[str], list[int], list[int]]:
    """The largest categories of the bytes allocated inside the phase and live at its peak: names, bytes, and
    the bytes of each decided by a size, lifetime, layout or time relation rather than a frame (inferred)."""
    if peak_index < lo:
        return [], [], []
    result = attribution_at(device, int(peak_index)) if attribution_at is not None else attribute(
        snapshot, at=int(peak_index), rules=rules, device=device, timeline=timeline, markers=markers)
    b = result.blocks
    b = b[b["device"] == device]
    inside = b[(b["alloc_index"] >= lo) & (b["alloc_index"] <= peak_index)]
    totals = inside.groupby("category", sort=False)["size"].sum().sort_values(ascending=False, kind="stable")
    guessed = inside[inside["inferred"].astype(bool)].groupby("category", sort=False)["size"].sum()
    names = [str(c) for c in totals.index[:top]]
    return names, [int(v) for v in totals.to_numpy()[:top]], [int(guessed.get(c, 0)) for c in names]


def _largest(rows: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The n rows with the largest transient on each device (the earlier start first on ties)."""
    counts: dict[int, int] = {}
    kept = []
    for row in sorted(rows, key=lambda r: (r["device"], -r["transient_bytes"], r["start_index"])):
        if counts.get(row["device"], 0) < n:
            counts[row["device"]] = counts.get(row["device"], 0) + 1
            kept.append(row)
    return kept


def phase_table(snapshot: Snapshot, timeline: Timeline | None = None, markers: pd.DataFrame | None = None,
                rules: RuleSet | None = None, categories: bool = True, top: int = 3,
                device: int | None = None, kinds: Collection[str] | None = None,
                largest: int | None = None, attribute_largest: int | None = None,
                attribution_at: AttributionAt | None = None) -> pd.DataFrame:
    """Before / peak / after of every span on every device it touches (columns PHASE_COLUMNS).

    `kinds`: only spans of these kinds ("phase", "request", "annotation", "metadata"). `largest`: only the
    N spans with the largest transient on each device (a serving run marks thousands of requests), so the
    top `top` categories are attributed for those alone. `attribute_largest`: keep every span but attribute
    only the N largest per device (the others' categories stay empty). `attribution_at(device, index)`: where
    the caller keeps attributions (`over_time.InstantAttributions.at`, made with the same rules and markers),
    the phases' peaks are taken from it rather than attributed again."""
    timeline = timeline or replay(snapshot)
    rules = rules or shipped_rules()
    table = spans(snapshot, markers)
    if kinds is not None:
        table = table[table["kind"].isin(list(kinds))]
    rows = []
    devices = [device] if device is not None else sorted(timeline.devices)
    for span in table.itertuples(index=False):
        for d in devices:
            if d not in timeline.devices or (span.device is not pd.NA and int(span.device) != d):
                continue
            dt = timeline[d]
            found = _window(dt, span)
            if found is None:
                continue
            lo, hi, clipped = found
            m = _measure(dt, lo, hi)
            rows.append({"device": d, "phase": span.phase, "occurrence": int(span.occurrence), "label": span.label,
                         "kind": span.kind,
                         "source": span.source, "start_us": span.start_us, "end_us": span.end_us,
                         "clipped": clipped, "open": span.end_us is pd.NA, "start_index": lo, "end_index": hi, **m,
                         "peak_time_us": dt.time_at(m["peak_index"]), "top_categories": [],
                         "top_category_bytes": [], "top_category_inferred_bytes": [], "attrs": span.attrs})
    if largest is not None:
        rows = _largest(rows, largest)
    if categories:
        for row in rows if attribute_largest is None else _largest(rows, attribute_largest):
            row["top_categories"], row["top_category_bytes"], row["top_category_inferred_bytes"] = _top_categories(
                snapshot, timeline, row["device"], row["start_index"], row["peak_index"], rules, top, markers,
                attribution_at)
    df = pd.DataFrame(rows, columns=PHASE_COLUMNS)
    for c in ("start_us", "end_us", "peak_time_us"):
        df[c] = df[c].astype("Int64")
    return df.sort_values(["device", "start_index", "end_index"], ascending=[True, True, False], kind="stable",
                          ignore_index=True)


def phase_instant(snapshot: Snapshot, name: str, timeline: Timeline | None = None,
                  markers: pd.DataFrame | None = None, device: int | None = None) -> tuple[int, int, pd.Series]:
    """(device, event index, phase row) of the highest active bytes inside phase `name` (see `find_phase`)."""
    timeline = timeline or replay(snapshot)
    table = phase_table(snapshot, timeline, markers, categories=False, device=device)
    hits = find_phase(table, name, snapshot.source)
    devices = sorted(set(int(d) for d in hits["device"]))
    if len(devices) > 1:
        raise UsageError(f"{snapshot.source}: phase {name!r} spans devices {devices}; choose one with --device")
    best = hits.loc[hits["peak_bytes"].idxmax()]
    return devices[0], int(best["peak_index"]), best


def attribute_phase(snapshot: Snapshot, name: str, timeline: Timeline | None = None,
                    markers: pd.DataFrame | None = None, rules: RuleSet | None = None,
                    device: int | None = None) -> Attribution:
    """`attribute` at the peak inside phase `name` (see `phase_instant`); the instant is labelled with the phase,
    and its baseline is the phase's start (the active bytes just before it), so its transient is the one
    `phase_table` gives the phase."""
    timeline = timeline or replay(snapshot)
    d, index, row = phase_instant(snapshot, name, timeline, markers, device)
    result = attribute(snapshot, at=int(index), rules=rules, device=d, timeline=timeline, markers=markers)
    label = f"peak of phase {row['label']}"
    instants = {k: dataclasses.replace(v, label=label, baseline_active_bytes=int(row["before_bytes"]),
                                       baseline=f"the start of phase {row['label']}")
                for k, v in result.instants.items()}
    return dataclasses.replace(result, instants=instants)


def phase_spans(snapshot: Snapshot, device: int | None = None) -> pd.DataFrame:
    """`record_function` spans from the annotations (of `device` when the annotations name it), in start
    order, named so both sides of a diff line up: a name used more than once becomes "name#k". Spans are
    paired by `phases.annotation_spans` (start_us null: began before the trace; end_us null: still open).
    Columns: PHASE_SPAN_COLUMNS."""
    found = annotation_spans(snapshot)
    if device is not None and any(s["device"] == device for s in found):
        found = [s for s in found if s["device"] == device]
    found.sort(key=lambda s: (s["start_us"] is not None,
                              s["start_us"] if s["start_us"] is not None else (s["end_us"] or 0)))
    counts: dict[str, int] = {}
    for s in found:
        counts[s["name"]] = counts.get(s["name"], 0) + 1
    seen: dict[str, int] = {}
    rows = []
    for s in found:
        name = s["name"]
        seen[name] = seen.get(name, 0) + 1
        key = name if counts[name] == 1 else f"{name}#{seen[name]}"
        rows.append({"phase": key, "name": name, "occurrence": seen[name], "start_us": s["start_us"],
                     "end_us": s["end_us"]})
    df = pd.DataFrame(rows, columns=PHASE_SPAN_COLUMNS)
    for c in ("start_us", "end_us"):
        df[c] = df[c].astype("Int64")
    return df
