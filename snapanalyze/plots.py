"""Plots: timelines, categories over time and attribution results → plotly Figures (never shown or saved).

Contract: every function takes analysis results (a Timeline, a peaks or categories-over-time DataFrame, an
Attribution) and returns a `plotly.graph_objects.Figure` styled with the small fixed `TEMPLATE` (so a
figure is the same whatever plotly's default template is). Nothing here prints, shows, writes or analyses.
Byte axes are in GiB; hover texts give exact byte counts where the value is exact.

- `timeline_figure`: active, reserved and allocated (estimate) bytes of one device over the trace window,
  drawn as steps (memory changes only at events: between two events a curve is flat, never a ramp), with
  each peak (and each OOM entry) marked at its exact value. Long traces are drawn from a min/max envelope
  (`envelope_indices`) so spikes stay visible while the figure stays small; peak markers are always exact.
  Given a run's NVML samples it adds NVML used as a line of its sampled points (the samples inside the
  window and one on each side), and given a `phase_table` the phases (kinds "phase" and "annotation") as
  shaded bands: the few that matter drawn and labelled (around each peak, the largest risers), the rest
  behind one legend entry, hidden until clicked (at most `MAX_BANDS` in all), coloured by phase name.
- `categories_figure`: the stacked bytes per category after every event (`analyze.over_time.category_curves`,
  from the attributed instants; bytes none of them saw in grey), drawn as steps under the exact active curve.
- `segment_map_figure`: a `SegmentMap` (`analyze.segment_map`): each segment a bar of its active, pending
  free and free pieces, the largest free block outlined and a failed request drawn to scale.
- `icicle_figure`: the live stacks at one instant, category → frames outermost → innermost (Python frames
  only where a stack has any, C++ frames where it has nothing else), with the RuleSet's plumbing frames
  hidden, runs of single-child frames merged, and small branches folded so the node count stays bounded;
  labels too small to read at the default size are hidden (the hover keeps them).
- `compare_figure`: bytes per category at two instants side by side.
- `ranks_figure`: per rank (and device) of a run, the bytes per category at its peak, stacked, with NVML
  used at the peak marked (`analyze.ranks` tables).
- `outside_figure`: memory outside the allocator (NVML used − reserved) and other processes' bytes over
  time, one series per rank and device (`analyze.outside.join_samples` frames).

Text that plotly renders (frame names, file paths) is HTML-escaped first, since plotly interprets a few
tags in labels.
"""

from __future__ import annotations

import functools
import heapq
import html
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .analyze.attribute import Attribution
from .analyze.over_time import UNATTRIBUTED
from .analyze.rules import shipped_rules
from .analyze.segment_map import SegmentMap
from .envelope import envelope_indices
from .replay import DeviceTimeline, Timeline
from .stacks import is_python_frame, short_path
from .units import fmt_bytes, fmt_duration_us

GiB = float(1 << 30)
UNATTRIBUTED_COLOR = "#d4d4d8"  # bytes no attributed instant saw (over_time.UNATTRIBUTED)
TIMELINE_MAX_POINTS = 4000      # per curve; longer traces are drawn from their min/max envelope
FrameLabel = Callable[[tuple[str, int, str]], str]

TEMPLATE = go.layout.Template(layout=go.Layout(
    font={"family": "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif", "size": 12, "color": "#222"},
    paper_bgcolor="white", plot_bgcolor="white",
    xaxis={"showgrid": True, "gridcolor": "#e8e8e8", "zeroline": False, "linecolor": "#888", "ticks": "outside"},
    yaxis={"showgrid": True, "gridcolor": "#e8e8e8", "zeroline": False, "linecolor": "#888", "ticks": "outside"},
    hoverlabel={"align": "left"}, margin={"l": 60, "r": 20, "t": 40, "b": 50},
    legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "xanchor": "left", "x": 0},
))

FALLBACK_COLORS = ("#17becf", "#bcbd22", "#e377c2", "#7f7f7f", "#ff9896", "#98df8a", "#c5b0d5", "#c49c94")
CURVE_COLORS = {"active": "#1f77b4", "reserved": "#7f7f7f", "allocated_est": "#2ca02c", "peak": "#d62728",
                "oom": "#000000", "nvml": "#9467bd"}
# Phase bands: a soft colour per phase name, in order of first appearance.
PHASE_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#8172b2", "#937860", "#da8bc3", "#ccb974", "#64b5cd")
BAND_KINDS = ("phase", "annotation")     # drawn as bands; requests and user_metadata spans are not
MAX_BANDS = 200                          # per figure, drawn and on demand; a note counts the rest
MAX_SHOWN_BANDS = 8                      # bands drawn and labelled: around the peaks, then the largest risers
MAX_BAND_LEGEND = 10                     # phase names with a legend entry
ICICLE_FONT = 12                         # px: icicle labels at this size,
ICICLE_MIN_FONT = 10                     # and hidden (kept in the hover) where a box cannot show them at this
SERIES_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


def escape(text: str) -> str:
    """Text made safe for a plotly label or hover (plotly interprets <br>, <b>, <a href=…> in text)."""
    return html.escape(text, quote=False)


@functools.cache
def _shipped_colors() -> dict[str, str]:
    """A stable colour per shipped category: its `color` in analyze/categories.toml."""
    return {c.name: c.color for c in shipped_rules().categories.values() if c.color}


def category_color(category: str, known: Sequence[str] = ()) -> str:
    """The colour of a category: fixed for shipped ones, else by its position among `known` extra names."""
    shipped = _shipped_colors()
    if category in shipped:
        return shipped[category]
    extra = sorted(c for c in set(known) | {category} if c not in shipped)
    return FALLBACK_COLORS[extra.index(category) % len(FALLBACK_COLORS)]


def frame_label(frame: tuple[str, int, str]) -> str:
    """'function (pkg/file.py:line)' for a Python frame, the bare symbol for a C++ frame."""
    filename, line, name = frame
    if is_python_frame(filename):
        return f"{name} ({short_path(filename)}:{line})"
    return cpp_symbol(name)


def _box_label(label: str) -> str:
    """An icicle box's text: a frame label with its file as a bare name ('forward (model.py:520)')."""
    match = re.fullmatch(r"(.*) \((.+):(\d+)\)", label)
    if match is None:
        return label
    name, path, line = match.groups()
    return f"{name} ({path.rsplit('/', 1)[-1]}:{line})"


def cpp_symbol(name: str) -> str:
    """A C++ frame name without its trailing argument list ('at::native::mm(at::Tensor const&)' → 'at::native::mm')."""
    if not name.endswith(")"):
        return name
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(name[i], 0)
        if depth == 0:
            return name[:i] or name
    return name


# -- axes ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TimeAxis:
    """Maps event indices of one device to x values: time into the window, or the event index itself."""

    title: str
    origin_us: int | None
    scale: float            # µs per unit; 0 when the x axis is the event index
    unit: str

    def x(self, dt: DeviceTimeline, indices: np.ndarray) -> np.ndarray:
        indices = np.asarray(indices, dtype=np.int64)
        if self.origin_us is None or dt.time_us is None:
            return indices.astype(np.float64)
        times = dt.time_us[np.maximum(indices, 0)].astype(np.int64) - self.origin_us
        return np.where(indices < 0, 0, times).astype(np.float64) / self.scale

    def describe(self, dt: DeviceTimeline, index: int) -> str:
        """'2.38 ms into the window (event 598)' or 'event 598' without timestamps."""
        event = "before the first event" if index < 0 else f"event {index:,}"
        t = dt.time_at(index)
        if self.origin_us is None or t is None:
            return event
        return f"{fmt_duration_us(t - self.origin_us)} into the window ({event})"


def time_axis(dt: DeviceTimeline) -> TimeAxis:
    """The x axis for a device: time into its window in s, ms or µs — or the event index without times."""
    if dt.time_us is None or len(dt) == 0:
        return TimeAxis("event index", None, 0.0, "")
    origin = int(dt.time_us[0])
    span = int(dt.time_us[-1]) - origin
    for limit, scale, unit in ((1_000_000, 1e6, "s"), (1000, 1e3, "ms")):
        if span >= limit:
            return TimeAxis(f"time into the window ({unit})", origin, scale, unit)
    return TimeAxis("time into the window (µs)", origin, 1.0, "µs")


# -- timelines ----------------------------------------------------------------------------------------------

def _curve(dt: DeviceTimeline, axis: TimeAxis, values: np.ndarray, baseline: int, buckets: int,
           keep: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x, y (GiB) and event index of a curve drawn from its envelope, the baseline first (index −1)."""
    idx = envelope_indices(values, buckets) if len(values) else np.zeros(0, dtype=np.int64)
    if len(keep):
        idx = np.union1d(idx, np.asarray([k for k in keep if k >= 0], dtype=np.int64))
    idx = np.concatenate([[-1], idx]).astype(np.int64)
    y = np.concatenate([[baseline], values[idx[1:]]]).astype(np.float64) / GiB
    return axis.x(dt, idx), y, idx


def timeline_figure(timeline: Timeline, device: int, peaks: pd.DataFrame | None = None,
                    ooms: pd.DataFrame | None = None, max_points: int = TIMELINE_MAX_POINTS,
                    height: int = 380, nvml: pd.DataFrame | None = None, phases: pd.DataFrame | None = None,
                    max_bands: int = MAX_BANDS) -> go.Figure:
    """Active / reserved / allocated (estimate) bytes of `device`, peaks and OOM entries marked.

    `peaks`: rows of `find_peaks` (other devices' rows are ignored); `ooms`: rows of `Snapshot.ooms`;
    `nvml`: NVML rows of the rank (`load.samples` columns; this device's are drawn as "NVML used");
    `phases`: rows of `analyze.phases.phase_table`, drawn as shaded bands behind the curves.
    Each curve has at most about `max_points` points (a min/max envelope); peaks are exact."""
    dt = timeline[device]
    axis = time_axis(dt)
    buckets = max(1, max_points // 2)
    peak_rows = peaks[peaks["device"] == device] if peaks is not None else None
    keep = [int(i) for i in peak_rows["event_index"]] if peak_rows is not None else []
    fig = go.Figure(layout={"template": TEMPLATE, "height": height,
                            "xaxis": {"title": {"text": axis.title}},
                            "yaxis": {"title": {"text": "GiB"}}, "hovermode": "closest"})
    curves = (("reserved", "reserved (exact)", dt.reserved, dt.baseline_reserved, "solid"),
              ("allocated_est", "allocated (estimate)", dt.allocated_est, dt.baseline_allocated_est, "dot"),
              ("active", "active (exact)", dt.active, dt.baseline_active, "solid"))
    for key, name, values, baseline, dash in curves:
        x, y, idx = _curve(dt, axis, values, baseline, buckets, keep if key == "active" else ())
        fig.add_trace(go.Scatter(
            x=x, y=y, customdata=idx, name=name, mode="lines", line={"color": CURVE_COLORS[key], "dash": dash,
                                                                      "width": 1.5, "shape": "hv"},
            hovertemplate=f"{name}<br>%{{y:.3f}} GiB<br>event %{{customdata}}<extra></extra>"))
    if peak_rows is not None and len(peak_rows):
        idx = peak_rows["event_index"].to_numpy(dtype=np.int64)
        fig.add_trace(go.Scatter(
            x=axis.x(dt, idx), y=peak_rows["active_bytes"].to_numpy(dtype=np.float64) / GiB,
            mode="markers+text", name="peaks",
            text=_spread_labels(axis.x(dt, idx), [f"peak {int(r)}" for r in peak_rows["peak"]], _span(dt, axis)),
            textposition="top center", marker={"color": CURVE_COLORS["peak"], "size": 9, "symbol": "diamond"},
            hovertext=[f"peak {int(r.peak)}: {fmt_bytes(int(r.active_bytes))} active ({int(r.active_bytes):,} B)"
                       f"<br>{escape(axis.describe(dt, int(r.event_index)))}"
                       for r in peak_rows.itertuples()],
            hoverinfo="text"))
    oom_rows = ooms[ooms["device"] == device] if ooms is not None else None
    if oom_rows is not None and len(oom_rows):
        idx = oom_rows["index"].to_numpy(dtype=np.int64)
        fig.add_trace(go.Scatter(
            x=axis.x(dt, idx), y=np.array([dt.active_at(int(i)) for i in idx], dtype=np.float64) / GiB,
            mode="markers", name="OOM", marker={"color": CURVE_COLORS["oom"], "size": 11, "symbol": "x"},
            hovertext=[f"OOM: a {fmt_bytes(int(r.size))} request failed"
                       f"<br>{escape(axis.describe(dt, int(r.index)))}" for r in oom_rows.itertuples()],
            hoverinfo="text"))
    if nvml is not None:
        _add_nvml(fig, dt, axis, nvml, buckets)
    if phases is not None:
        _add_bands(fig, dt, axis, phases, max_bands, keep)
    return fig


def nvml_in_window(dt: DeviceTimeline, nvml: pd.DataFrame) -> pd.DataFrame:
    """The NVML rows of `dt.device` inside its trace window, plus the last one before it and the first after
    (so a line reaches both edges); empty when the trace has no timestamps."""
    rows = nvml[nvml["device"] == dt.device].sort_values("time_us", kind="stable")
    if dt.time_us is None or len(dt) == 0 or not len(rows):
        return rows.iloc[0:0]
    t = rows["time_us"].to_numpy(dtype=np.int64)
    lo = max(int(np.searchsorted(t, int(dt.time_us[0]), side="left")) - 1, 0)
    hi = min(int(np.searchsorted(t, int(dt.time_us[-1]), side="right")) + 1, len(t))
    return rows.iloc[lo:hi]


def _add_nvml(fig: go.Figure, dt: DeviceTimeline, axis: TimeAxis, nvml: pd.DataFrame, buckets: int) -> None:
    rows = nvml_in_window(dt, nvml)
    if not len(rows) or axis.origin_us is None:
        return
    used = rows["used_bytes"].to_numpy(dtype=np.int64)
    keep = envelope_indices(used, buckets)
    offsets = rows["time_us"].to_numpy(dtype=np.int64)[keep] - axis.origin_us
    hover = []
    for u, d in zip(used[keep].tolist(), offsets.tolist()):
        when = f"{fmt_duration_us(d)} into the window" if d >= 0 else f"{fmt_duration_us(-d)} before the window"
        hover.append(f"NVML used: {fmt_bytes(u)} ({u:,} B)<br>sampled {escape(when)}")
    fig.add_trace(go.Scatter(
        x=offsets.astype(np.float64) / axis.scale, y=used[keep].astype(np.float64) / GiB,
        name="NVML used (sampled)", mode="lines+markers", line={"color": CURVE_COLORS["nvml"], "width": 1.5},
        marker={"size": 4, "color": CURVE_COLORS["nvml"]}, hovertext=hover, hoverinfo="text"))
    span = _span(dt, axis)
    if span > 0:            # the samples around the window must not stretch it: lines run out at the edges
        fig.update_xaxes(range=[0.0, span])


def _phase_names(rows: pd.DataFrame) -> list[str]:
    """Each phase's name as `snapanalyze phases` prints it and --phase accepts it ('prefill#2' when the name
    is repeated, else the bare name: `analyze.phases.phase_label`)."""
    return [str(label) for label in rows["label"]]


def _add_bands(fig: go.Figure, dt: DeviceTimeline, axis: TimeAxis, phases: pd.DataFrame, max_bands: int,
               peaks: Sequence[int] = (), shown: int = MAX_SHOWN_BANDS) -> None:
    """The phases of `dt.device` as bands behind the curves. The few that matter are drawn and labelled: the
    innermost span holding each of `peaks` (in order), then the largest risers (transient bytes), `shown` in
    all. The rest — up to `max_bands` bands in all, the longest — are there on demand: one legend entry,
    "more phases", hidden until clicked; a note counts the phases beyond that."""
    rows = phases[(phases["device"] == dt.device) & phases["kind"].isin(BAND_KINDS)]
    if not len(rows) or len(dt) == 0:
        return
    span = _span(dt, axis)
    bands = []                          # (x0, x1, phase, label, start_index, end_index, transient)
    for r, name in zip(rows.itertuples(index=False), _phase_names(rows)):
        lo, hi = int(r.start_index), int(r.end_index)
        if axis.origin_us is None:                       # no timestamps: x is the event index
            x0, x1 = float(max(lo, 0)), float(max(hi, 0))
        else:                                            # a span open at either end runs to the window's edge
            x0 = 0.0 if pd.isna(r.start_us) else max(0.0, (int(r.start_us) - axis.origin_us) / axis.scale)
            x1 = span if pd.isna(r.end_us) else min(span, (int(r.end_us) - axis.origin_us) / axis.scale)
        if x1 < x0:
            continue
        rise = 0 if pd.isna(r.transient_bytes) else int(r.transient_bytes)
        bands.append((x0, x1, str(r.phase), name, lo, hi, rise))
    chosen: list[int] = []
    for peak in peaks:                                   # the innermost span around each peak
        around = [i for i, b in enumerate(bands) if b[4] <= peak <= b[5] and b[5] >= b[4]]
        if around:
            best = min(around, key=lambda i: (bands[i][5] - bands[i][4], -bands[i][4], i))
            if best not in chosen and len(chosen) < shown:
                chosen.append(best)
    for i in sorted(range(len(bands)), key=lambda i: (-bands[i][6], bands[i][0], i)):
        if len(chosen) >= shown:
            break
        if i not in chosen:
            chosen.append(i)
    rest = sorted((i for i in range(len(bands)) if i not in chosen),
                  key=lambda i: (-(bands[i][1] - bands[i][0]), bands[i][0], i))[:max(0, max_bands - len(chosen))]
    colors: dict[str, str] = {}
    for b in sorted(bands, key=lambda b: (b[0], b[3])):
        colors.setdefault(b[2], PHASE_COLORS[len(colors) % len(PHASE_COLORS)])
    drawn = sorted(chosen, key=lambda i: (bands[i][0], -(bands[i][1] - bands[i][0]), bands[i][3]))
    labels = _spread_labels(np.array([bands[i][0] for i in drawn], dtype=np.float64), [bands[i][3] for i in drawn],
                            span, 0.06)
    legend: set[str] = set()
    for i, label in zip(drawn, labels):
        x0, x1, phase = bands[i][0], bands[i][1], bands[i][2]
        show = phase not in legend and len(legend) < MAX_BAND_LEGEND
        if show:
            legend.add(phase)
        fig.add_shape(type="rect", xref="x", yref="paper", x0=x0, x1=x1, y0=0, y1=1, layer="below",
                      fillcolor=colors[phase], opacity=0.13, line={"width": 0}, name=escape(f"phase: {phase}"),
                      legendgroup=escape(f"phase: {phase}"), showlegend=show)
        if label:                   # at the foot of the band: the top belongs to the peak labels
            right = span > 0 and x0 > 0.9 * span
            fig.add_annotation(x=x1 if right else x0, y=0, xref="x", yref="paper", text=escape(label),
                               showarrow=False, xanchor="right" if right else "left", yanchor="bottom",
                               font={"size": 10, "color": colors[phase]}, bgcolor="rgba(255,255,255,0.7)")
    for n, i in enumerate(sorted(rest, key=lambda i: (bands[i][0], i))):
        x0, x1, phase = bands[i][0], bands[i][1], bands[i][2]
        fig.add_shape(type="rect", xref="x", yref="paper", x0=x0, x1=x1, y0=0, y1=1, layer="below",
                      fillcolor=colors[phase], opacity=0.13, line={"width": 0}, visible="legendonly",
                      name=escape(f"{len(rest)} more phases (click to show)"), legendgroup="more phases",
                      showlegend=n == 0)
    left = len(bands) - len(drawn) - len(rest)
    if left > 0:
        fig.add_annotation(x=1, y=0, xref="paper", yref="paper", showarrow=False, xanchor="right",
                           yanchor="bottom", font={"size": 10, "color": "#6b6b70"},
                           text=f"{left} shorter phases not drawn")


def categories_figure(curves: pd.DataFrame, timeline: Timeline, device: int, order: Sequence[str] = (),
                      marks: Sequence[tuple[int, str]] = (), height: int = 380) -> go.Figure:
    """Stacked bytes per category of `device` after every event (`analyze.over_time.category_curves`: exact,
    from the attributed instants; UNATTRIBUTED on top, hatched grey), drawn as steps, with the exact active
    curve over them at the same events (their sum: the envelope `category_curves` kept).

    `order` lists categories bottom first (unlisted ones follow by name); `marks` are (event index, label)
    pairs drawn as vertical lines (peaks, OOMs)."""
    dt = timeline[device]
    axis = time_axis(dt)
    part = curves[curves["device"] == device]
    present = [c for c in dict.fromkeys(part["category"]) if c != UNATTRIBUTED]
    stacked = [c for c in order if c in present] + sorted(c for c in present if c not in order)
    if (part["category"] == UNATTRIBUTED).any():
        stacked.append(UNATTRIBUTED)
    fig = go.Figure(layout={"template": TEMPLATE, "height": height,
                            "xaxis": {"title": {"text": axis.title}},
                            "yaxis": {"title": {"text": "GiB live"}, "rangemode": "tozero"},
                            "hovermode": "x unified"})
    for category in stacked:
        rows = part[part["category"] == category]
        idx = rows["event_index"].to_numpy(dtype=np.int64)
        color = UNATTRIBUTED_COLOR if category == UNATTRIBUTED else category_color(category, present)
        name = f"{UNATTRIBUTED} (live only between attributed instants)" if category == UNATTRIBUTED else category
        fig.add_trace(go.Scatter(
            x=axis.x(dt, idx), y=rows["bytes"].to_numpy(dtype=np.float64) / GiB, name=escape(name),
            mode="lines", stackgroup="categories", line={"width": 0, "color": color, "shape": "hv"},
            fillcolor=color, customdata=idx,
            fillpattern={"shape": "/", "fgcolor": "#a1a1aa", "bgcolor": color} if category == UNATTRIBUTED else None,
            hovertemplate=f"{escape(category)}: %{{y:.3f}} GiB<extra></extra>"))
    if len(part) and len(dt):
        idx = np.unique(part["event_index"].to_numpy(dtype=np.int64))     # the stack's events: the line is its top
        y = np.where(idx < 0, dt.baseline_active, dt.active[np.maximum(idx, 0)]).astype(np.float64) / GiB
        fig.add_trace(go.Scatter(
            x=axis.x(dt, idx), y=y, customdata=idx, name="active (exact)", mode="lines",
            line={"color": "#222222", "width": 1, "shape": "hv"},
            hovertemplate="active (exact): %{y:.3f} GiB, event %{customdata}<extra></extra>"))
    xs = axis.x(dt, np.array([index for index, _ in marks], dtype=np.int64))
    for x, (_, label), shown in zip(xs, marks, _spread_labels(xs, [label for _, label in marks], _span(dt, axis))):
        fig.add_vline(x=float(x), line={"color": CURVE_COLORS["peak"], "width": 1, "dash": "dot"})
        if shown:
            fig.add_annotation(x=float(x), y=1, yref="paper", text=escape(label), showarrow=False,
                               yanchor="bottom", font={"size": 10, "color": CURVE_COLORS["peak"]})
    return fig


def _span(dt: DeviceTimeline, axis: TimeAxis) -> float:
    """The width of a device's x axis (start of the window to its last event)."""
    return float(np.ptp(axis.x(dt, np.array([-1, len(dt) - 1], dtype=np.int64)))) if len(dt) else 0.0


def _spread_labels(xs: np.ndarray, labels: list[str], span: float, gap: float = 0.06) -> list[str]:
    """`labels`, with each one closer than `gap` × `span` to an earlier shown one blanked (no overprinting)."""
    shown: list[float] = []
    out = []
    for x, label in zip(xs.tolist(), labels):
        if any(abs(x - s) <= gap * span for s in shown):
            out.append("")
        else:
            shown.append(x)
            out.append(label)
    return out


def compare_figure(first: Attribution, second: Attribution, device: int, labels: tuple[str, str] | None = None,
                   height: int = 360) -> go.Figure:
    """Bytes per category of `device` at two attributed instants, as grouped horizontal bars."""
    names = labels or (first.instants[device].label, second.instants[device].label)
    parts = [a.summary[a.summary["device"] == device].set_index("category")["bytes"] for a in (first, second)]
    categories = sorted(set(parts[0].index) | set(parts[1].index),
                        key=lambda c: (-max(int(parts[0].get(c, 0)), int(parts[1].get(c, 0))), c))
    fig = go.Figure(layout={"template": TEMPLATE, "height": height, "barmode": "group",
                            "xaxis": {"title": {"text": "GiB live"}},
                            "yaxis": {"autorange": "reversed"}})
    for name, part, color in zip(names, parts, ("#4c72b0", "#dd8452")):
        values = np.array([int(part.get(c, 0)) for c in categories], dtype=np.int64)
        fig.add_trace(go.Bar(
            y=categories, x=values.astype(np.float64) / GiB, name=escape(name), orientation="h",
            marker={"color": color}, hovertext=[f"{escape(name)} · {escape(c)}: {fmt_bytes(int(v))} ({int(v):,} B)"
                                                for c, v in zip(categories, values)],
            hoverinfo="text"))
    return fig


def ranks_figure(table: pd.DataFrame, categories: pd.DataFrame, order: Sequence[str] = (),
                 height: int | None = None) -> go.Figure:
    """Bytes per category at each rank's peak, stacked horizontally, with NVML used at the peak marked.

    `table`: `RankComparison.table` rows (rank, device, active_bytes, nvml_used_bytes, nvml_used_measured,
    outlier, …); `categories`: `RankComparison.categories` (rank, device, category, bytes). `order` lists
    categories drawn first (unlisted ones follow by name)."""
    keys = [(int(r.rank), int(r.device)) for r in table.itertuples(index=False)]
    multi = len({d for _, d in keys}) > 1
    outliers = {(int(r.rank), int(r.device)) for r in table.itertuples(index=False) if bool(r.outlier)}
    names = [f"rank {r}" + (f" · device {d}" if multi else "") + (" (outlier)" if (r, d) in outliers else "")
             for r, d in keys]
    present = list(dict.fromkeys(categories["category"]))
    stacked = [c for c in order if c in present] + sorted(c for c in present if c not in order)
    fig = go.Figure(layout={"template": TEMPLATE, "height": height or max(220, 90 + 36 * len(keys)),
                            "barmode": "stack", "xaxis": {"title": {"text": "GiB at the rank's peak"}},
                            "yaxis": {"autorange": "reversed", "type": "category", "automargin": True},
                            "hovermode": "closest"})
    by_key = categories.set_index(["rank", "device", "category"])["bytes"] if len(categories) else None
    for category in stacked:
        values = np.array([int(by_key.get((r, d, category), 0)) if by_key is not None else 0 for r, d in keys],
                          dtype=np.int64)
        color = category_color(category, present)
        fig.add_trace(go.Bar(
            y=names, x=values.astype(np.float64) / GiB, name=escape(category), orientation="h",
            marker={"color": color},
            hovertext=[f"{escape(n)} · {escape(category)}: {fmt_bytes(int(v))} ({int(v):,} B)"
                       for n, v in zip(names, values)], hoverinfo="text"))
    used = [(n, r.nvml_used_bytes, bool(r.nvml_used_measured)) for n, r in zip(names, table.itertuples(index=False))
            if r.nvml_used_bytes is not pd.NA and r.nvml_used_bytes is not None]
    if used:
        fig.add_trace(go.Scatter(
            y=[n for n, _, _ in used], x=[int(u) / GiB for _, u, _ in used], mode="markers", name="NVML used",
            marker={"color": CURVE_COLORS["nvml"], "size": 11, "symbol": "diamond"},
            hovertext=[f"{escape(n)}: NVML used {fmt_bytes(int(u))} ({int(u):,} B)"
                       + ("" if measured else " (estimated from the samples around the peak)")
                       for n, u, measured in used], hoverinfo="text"))
    return fig


def outside_figure(series: dict[str, pd.DataFrame], origin_us: int, max_points: int = 2000,
                   height: int = 340) -> go.Figure:
    """Memory outside the allocator (used − reserved) and other processes' bytes over time, one colour per
    series (`label` → an `analyze.outside.join_samples` frame); x in seconds since `origin_us`. Each line
    keeps at most about `max_points` points (a min/max envelope)."""
    fig = go.Figure(layout={"template": TEMPLATE, "height": height,
                            "xaxis": {"title": {"text": "seconds from the start of the earliest trace window"}},
                            "yaxis": {"title": {"text": "GiB outside the allocator"}, "rangemode": "tozero"},
                            "hovermode": "closest"})
    buckets = max(1, max_points // 2)
    for n, (label, joined) in enumerate(series.items()):
        color = SERIES_COLORS[n % len(SERIES_COLORS)]
        for column, name, dash in (("outside_bytes", "outside the allocator", "solid"),
                                   ("other_processes_bytes", "other processes", "dot")):
            part = joined[~joined[column].isna()]
            if not len(part) or (column == "other_processes_bytes" and not (part[column] > 0).any()):
                continue
            values = part[column].to_numpy(dtype=np.int64)
            keep = envelope_indices(values, buckets)
            t = part["time_us"].to_numpy(dtype=np.int64)[keep]
            fig.add_trace(go.Scatter(
                x=(t - origin_us).astype(np.float64) / 1e6, y=values[keep].astype(np.float64) / GiB,
                mode="lines+markers", name=escape(f"{label}: {name}"),
                line={"color": color, "dash": dash, "width": 1.5, "shape": "hv"}, marker={"size": 3},
                hovertext=[f"{escape(label)}: {name} {fmt_bytes(int(v))} ({int(v):,} B)"
                           for v in values[keep].tolist()], hoverinfo="text"))
    return fig


# -- segment map --------------------------------------------------------------------------------------------

PIECE_COLORS = {"active": "#4c72b0", "pending_free": "#dd8452", "inactive": "#e4e4e4"}
PIECE_NAMES = {"active": "active (live block)", "pending_free": "pending free (stream use)",
               "inactive": "free (cached, reusable)"}
MAX_SEGMENTS = 40            # segments drawn per map: those with the most free bytes (the largest free block's first)
MAX_FULL_SEGMENTS = 8        # of them, segments without a free byte (the largest): enough to show what full looks like
MAX_PIECES = 2000            # pieces drawn per map; beyond it adjacent pieces of one state merge, then fewer segments


def _byte_unit(largest: int) -> tuple[str, float]:
    for name, size in (("GiB", GiB), ("MiB", float(1 << 20)), ("KiB", 1024.0)):
        if largest >= size:
            return name, size
    return "B", 1.0


def _merge_runs(pieces: pd.DataFrame) -> pd.DataFrame:
    """Adjacent pieces of one state in one segment as one piece (sizes summed, `blocks` counted)."""
    seg = pieces["segment_address"].to_numpy(dtype=np.uint64)
    state = pieces["state"].astype(str).to_numpy()
    new = np.ones(len(pieces), dtype=bool)
    new[1:] = (seg[1:] != seg[:-1]) | (state[1:] != state[:-1])
    run = np.cumsum(new) - 1
    g = pieces.assign(run=run, blocks=1).groupby("run", sort=True)
    return g.agg(segment_address=("segment_address", "first"), offset=("offset", "first"), size=("size", "sum"),
                 state=("state", "first"), requested=("requested", "sum"),
                 blocks=("blocks", "sum")).reset_index(drop=True)


def segment_map_figure(smap: SegmentMap, max_segments: int = MAX_SEGMENTS, max_pieces: int = MAX_PIECES,
                       max_full: int = MAX_FULL_SEGMENTS, height: int | None = None) -> go.Figure:
    """Each segment of a `SegmentMap` as a horizontal bar from its start, cut into its pieces: active,
    pending free and free (inactive); the largest usable free block outlined and, given a request (an OOM),
    the failed request as a bar of its size on top, so a request longer than every free piece — although
    the free pieces together would hold it — shows as fragmentation.

    At most `max_segments` segments are drawn — the largest free block's first, then by free bytes, then by
    size, at most `max_full` of them without a free byte — and about `max_pieces` pieces (adjacent pieces
    of one state merge when there are more); a note says how many segments, and how many reserved and free
    bytes, are not drawn."""
    segs = smap.segments.reset_index(drop=True)
    number = {int(a): n + 1 for n, a in enumerate(segs["address"].tolist())}       # address order, from 1
    holds = segs["address"] == (smap.largest_free.segment_address if smap.largest_free is not None else -1)
    ranked = segs.assign(holds=holds).sort_values(["holds", "inactive_bytes", "size", "address"],
                                                  ascending=[False, False, False, True], kind="stable")
    full = ranked["inactive_bytes"].to_numpy() == 0
    ranked = ranked[~full | (np.cumsum(full) <= max_full)].head(max_segments)
    pieces = smap.pieces[smap.pieces["segment_address"].isin(ranked["address"])].assign(blocks=1)
    merged = len(pieces) > max_pieces
    if merged:
        pieces = _merge_runs(pieces)
        per = pieces.groupby("segment_address").size()
        counts = ranked["address"].map(per).fillna(0).to_numpy(dtype=np.int64)
        ranked = ranked.iloc[:max(1, int(np.searchsorted(np.cumsum(counts), max_pieces, side="right")))]
        pieces = pieces[pieces["segment_address"].isin(ranked["address"])]
    labels = {int(r.address): f"#{number[int(r.address)]} · {fmt_bytes(int(r.size))} {escape(str(r.segment_type))}"
              for r in ranked.itertuples(index=False)}
    info = {int(r.address): r for r in ranked.itertuples(index=False)}
    largest_shown = max([int(ranked["size"].max()) if len(ranked) else 0, smap.request_bytes or 0])
    unit, scale = _byte_unit(largest_shown)
    rows = ([f"failed request · {fmt_bytes(smap.request_bytes)}"] if smap.request_bytes is not None else []) \
        + list(labels.values())
    fig = go.Figure(layout={
        "template": TEMPLATE, "height": height or max(260, 130 + 22 * len(rows)), "barmode": "overlay",
        "xaxis": {"title": {"text": f"offset in the segment ({unit})"}, "rangemode": "tozero"},
        "yaxis": {"type": "category", "categoryorder": "array", "categoryarray": rows, "autorange": "reversed",
                  "automargin": True, "showgrid": False},
        "hovermode": "closest", "bargap": 0.25})
    for state in ("active", "pending_free", "inactive"):
        part = pieces[pieces["state"].astype(str).to_numpy() == state]
        if not len(part):
            continue
        a = part["segment_address"].to_numpy(dtype=np.uint64)
        sizes, offsets = part["size"].to_numpy(dtype=np.int64), part["offset"].to_numpy(dtype=np.int64)
        blocks, requested = part["blocks"].to_numpy(dtype=np.int64), part["requested"].to_numpy(dtype=np.int64)
        hover = []
        for seg_addr, size, offset, n, req in zip(a.tolist(), sizes.tolist(), offsets.tolist(), blocks.tolist(),
                                                  requested.tolist()):
            r = info[seg_addr]
            what = f"{PIECE_NAMES[state]}: {fmt_bytes(size)} ({size:,} B)"
            if n > 1:
                what += f" in {n} adjacent blocks"
            if state != "inactive":
                what += f", {fmt_bytes(req)} requested"
            hover.append(f"{what}<br>at +{fmt_bytes(offset)} in segment #{number[seg_addr]} (0x{seg_addr:x}, "
                         f"{fmt_bytes(int(r.size))}, {escape(str(r.segment_type))} pool, stream {int(r.stream)}, "
                         f"pool id {escape(str(r.pool))})")
        fig.add_trace(go.Bar(
            y=[labels[x] for x in a.tolist()], x=sizes.astype(np.float64) / scale,
            base=offsets.astype(np.float64) / scale, orientation="h", name=PIECE_NAMES[state],
            marker={"color": PIECE_COLORS[state], "line": {"width": 0.5, "color": "#ffffff" if state != "inactive"
                                                             else "#b0b0b0"}},
            hovertext=hover, hoverinfo="text"))
    largest = smap.largest_free
    if largest is not None and largest.segment_address in labels:
        what = "largest usable free block" if smap.request_bytes is not None else "largest free block"
        fig.add_trace(go.Bar(
            y=[labels[largest.segment_address]], x=[largest.size / scale], base=[largest.offset / scale],
            orientation="h", name=f"{what} · {fmt_bytes(largest.size)}",
            marker={"color": "rgba(44,160,44,0.35)", "line": {"width": 2.5, "color": "#2ca02c"}},
            hovertext=[f"{what}: {fmt_bytes(largest.size)} ({largest.size:,} B) at +{fmt_bytes(largest.offset)} "
                       f"in segment #{number[largest.segment_address]}"], hoverinfo="text"))
    if smap.request_bytes is not None:
        request = smap.request_bytes
        fits = largest is not None and largest.size >= request
        fig.add_trace(go.Bar(
            y=[rows[0]], x=[request / scale], base=[0.0], orientation="h",
            name=f"failed request · {fmt_bytes(request)}", marker={"color": CURVE_COLORS["peak"]},
            hovertext=[f"the request that failed: {fmt_bytes(request)} ({request:,} B) on stream "
                       f"{smap.request_stream}; the largest usable free block "
                       + (f"{fmt_bytes(largest.size)}" if largest is not None else "– (none)")
                       + (" would have held it" if fits else " is smaller")], hoverinfo="text"))
    hidden = segs[~segs["address"].isin(ranked["address"])]
    notes = []
    if len(hidden):
        free = int(hidden["inactive_bytes"].sum())
        notes.append(f"{len(hidden):,} more segment{'s' if len(hidden) != 1 else ''} not drawn "
                     f"({fmt_bytes(int(hidden['size'].sum()))} reserved, "
                     + (f"{fmt_bytes(free)} free)" if free else "every byte in use)"))
    if merged:
        notes.append("adjacent blocks of one state drawn as one piece")
    if not smap.exact:
        notes.append("layout estimated from the replay")
    if notes:                       # under the axis title
        fig.update_layout(margin={"b": 80})
        fig.add_annotation(x=0, y=0, xref="paper", yref="paper", showarrow=False, xanchor="left", yanchor="top",
                           yshift=-52, font={"size": 10, "color": "#6b6b70"}, text=escape("; ".join(notes)))
    return fig


# -- icicle -------------------------------------------------------------------------------------------------

@dataclass
class _Node:
    frames: list[str]
    value: int = 0
    own: int = 0                     # bytes of stacks that end here
    children: dict[str, _Node] = field(default_factory=dict)


def _merge_chains(node: _Node) -> None:
    """Merge each run of frames with a single child and no bytes of their own into one node."""
    for child in node.children.values():
        while len(child.children) == 1 and child.own == 0:
            (only,) = child.children.values()
            child.frames += only.frames
            child.children, child.own = only.children, only.own
        _merge_chains(child)


def icicle_figure(attribution: Attribution, device: int, label: FrameLabel | None = None,
                  max_nodes: int = 400, min_share: float = 0.01, max_depth: int = 8,
                  height: int = 520) -> go.Figure:
    """The live stacks of `device` at the attributed instant: category → frames outermost → innermost.

    Plumbing frames (the RuleSet's `is_plumbing`) are hidden; runs of frames with one child merge into one
    node (labelled by its innermost frame, the whole run in the hover). Branches under `min_share` of their
    category's live bytes, and any beyond `max_nodes`, fold into one "(N smaller)" node per parent, so a node's
    value is always the exact sum of its stacks' bytes. `label` formats a frame (default `frame_label`)."""
    label = label or frame_label
    snapshot, rules = attribution.snapshot, attribution.rules
    blocks = attribution.blocks[attribution.blocks["device"] == device]
    grouped = blocks.groupby(["category", "stack_id"], sort=True)["size"].sum()
    total = int(blocks["size"].sum())
    root = _Node(frames=[f"device {device}: {fmt_bytes(total)} live"], value=total)
    frame_names: dict[int, str] = {}
    place = {c: k for k, c in enumerate(dict.fromkeys(c for c, _ in grouped.index))}
    stacks = sorted(grouped.items(), key=lambda item: (place[item[0][0]], snapshot.stack(int(item[0][1]))))
    for (category, stack_id), size in stacks:         # by category, then by frames: never by stack id
        size = int(size)
        cat = root.children.setdefault(f"c:{category}", _Node(frames=[f"[{category}]"]))
        cat.value += size
        node = cat
        stack = snapshot.interner.stacks[int(stack_id)] if int(stack_id) >= 0 else ()
        path = []
        for fid in reversed(stack):                     # outermost first
            filename, _, name = snapshot.interner.frames[fid]
            if rules.is_plumbing(filename, name):
                continue
            path.append(fid)
        python = [fid for fid in path if is_python_frame(snapshot.interner.frames[fid][0])]
        path = python or path                           # the user's and the engine's frames, C++ only alone
        for fid in path:
            if fid not in frame_names:
                frame_names[fid] = label(snapshot.interner.frames[fid])
        if not path:
            path = [-1]
            frame_names[-1] = "(no frames)"
        for fid in path:
            node = node.children.setdefault(f"f:{fid}", _Node(frames=[frame_names[fid]]))
            node.value += size
        node.own += size
    for cat in root.children.values():
        _merge_chains(cat)

    ids: list[str] = []
    parents: list[str] = []
    labels: list[str] = []
    values: list[int] = []
    hovers: list[str] = []
    colors: list[str] = []
    categories = [k[2:] for k in root.children]

    def emit(node: _Node, parent: str, color: str) -> str:
        node_id = f"n{len(ids)}"
        text = _box_label(node.frames[-1]) + (f" (+{len(node.frames) - 1})" if len(node.frames) > 1 else "")
        chain = node.frames if len(node.frames) <= 24 else node.frames[:4] + ["⋮"] + node.frames[-19:]
        share = node.value / total if total else 0.0
        ids.append(node_id)
        parents.append(parent)
        labels.append(escape(text if len(text) <= 90 else text[:89] + "…"))
        values.append(node.value)
        hovers.append("<br>".join(escape(f) for f in chain)
                      + f"<br><b>{fmt_bytes(node.value)}</b> ({node.value:,} B, {100 * share:.1f}% of live)")
        colors.append(color)
        return node_id

    root_id = emit(root, "", "#f4f4f5")      # a light box: white read as an empty band
    queue: list[tuple[int, int, _Node, str, str, float]] = []   # (−value, order, node, parent, colour, floor)
    order = 0
    for key, child in sorted(root.children.items(), key=lambda kv: (-kv[1].value, kv[0])):
        heapq.heappush(queue, (-child.value, order, child, root_id, category_color(key[2:], categories),
                               child.value * min_share))
        order += 1
    folded: dict[str, list[int]] = {}             # parent id -> [branches folded, their bytes]
    while queue:
        _, _, node, parent, color, floor = heapq.heappop(queue)
        if parent != root_id and (node.value < floor or len(ids) >= max_nodes):
            folded.setdefault(parent, [0, 0])
            folded[parent][0] += 1
            folded[parent][1] += node.value
            continue
        node_id = emit(node, parent, color)
        for _, child in sorted(node.children.items(), key=lambda kv: (-kv[1].value, kv[0])):
            heapq.heappush(queue, (-child.value, order, child, node_id, color, floor))
            order += 1
    for parent, (count, value) in sorted(folded.items(), key=lambda kv: int(kv[0][1:])):
        ids.append(f"n{len(ids)}")
        parents.append(parent)
        labels.append(f"({count} smaller)")
        values.append(value)
        hovers.append(f"{count} smaller branch(es)<br><b>{fmt_bytes(value)}</b> ({value:,} B)")
        colors.append("#dddddd")
    fig = go.Figure(go.Icicle(
        ids=ids, parents=parents, labels=labels, values=values, branchvalues="total", maxdepth=max_depth,
        marker={"colors": colors, "line": {"width": 0.5, "color": "white"}}, customdata=hovers,
        hovertemplate="%{customdata}<extra></extra>", texttemplate="%{label}", tiling={"orientation": "v"},
        sort=False, root={"color": "#ffffff"}, insidetextfont={"size": ICICLE_FONT}),
        layout={"template": TEMPLATE, "height": height, "margin": {"l": 10, "r": 10, "t": 30, "b": 10},
                "uniformtext": {"minsize": ICICLE_MIN_FONT, "mode": "hide"}})
    return fig
