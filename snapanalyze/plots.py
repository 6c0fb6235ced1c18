"""Plots: timelines, categories over time and attribution results → plotly Figures (never shown or saved).

Contract: every function takes analysis results (a Timeline, a peaks or categories-over-time DataFrame, an
Attribution) and returns a `plotly.graph_objects.Figure` styled with the small fixed `TEMPLATE` (so a
figure is the same whatever plotly's default template is). Nothing here prints, shows, writes or analyses.
Byte axes are in GiB; hover texts give exact byte counts where the value is exact.

- `timeline_figure`: active, reserved and allocated (estimate) bytes of one device over the trace window,
  with each peak (and each OOM entry) marked at its exact value. Long traces are drawn from a min/max
  envelope (`envelope_indices`) so spikes stay visible while the figure stays small; peak markers are
  always exact. Given a run's NVML samples it adds NVML used as a line of its sampled points (the samples
  inside the window and one on each side), and given a `phase_table` the phases (kinds "phase" and
  "annotation") as shaded bands, at most `MAX_BANDS` of them (the longest), coloured by phase name.
- `categories_figure`: the stacked bytes per category at sampled instants (`analyze.over_time`).
- `icicle_figure`: the live stacks at one instant, category → frames outermost → innermost, with the
  RuleSet's plumbing frames hidden, runs of single-child frames merged, and small branches folded so the
  node count stays bounded.
- `compare_figure`: bytes per category at two instants side by side.
- `ranks_figure`: per rank (and device) of a run, the bytes per category at its peak, stacked, with NVML
  used at the peak marked (`analyze.ranks` tables).
- `outside_figure`: memory outside the allocator (NVML used − reserved) and other processes' bytes over
  time, one series per rank and device (`analyze.outside.join_samples` frames).

Text that plotly renders (frame names, file paths) is HTML-escaped first, since plotly interprets a few
tags in labels.
"""

from __future__ import annotations

import heapq
import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .analyze.attribute import Attribution
from .replay import DeviceTimeline, Timeline
from .stacks import is_python_frame, short_path
from .units import fmt_bytes, fmt_duration_us

GiB = float(1 << 30)
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

# A stable colour per shipped category; user categories get the FALLBACK colours in name order.
CATEGORY_COLORS: dict[str, str] = {
    "weights": "#4c72b0", "kv_cache": "#55a868", "graph_capture": "#8172b2", "concurrent_request": "#937860",
    "fallback_kernel": "#c44e52", "vision_encoder": "#da8bc3", "logits": "#dd8452", "attention": "#ccb974",
    "mlp": "#64b5cd", "communication": "#8c8c8c", "workspace": "#a1c9f4", "other": "#bbbbbb",
    "optimizer_state": "#2a3f73", "gradients": "#8fb8de", "inputs": "#ffb482",
}
FALLBACK_COLORS = ("#17becf", "#bcbd22", "#e377c2", "#7f7f7f", "#ff9896", "#98df8a", "#c5b0d5", "#c49c94")
CURVE_COLORS = {"active": "#1f77b4", "reserved": "#7f7f7f", "allocated_est": "#2ca02c", "peak": "#d62728",
                "oom": "#000000", "nvml": "#9467bd"}
# Phase bands: a soft colour per phase name, in order of first appearance.
PHASE_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#8172b2", "#937860", "#da8bc3", "#ccb974", "#64b5cd")
BAND_KINDS = ("phase", "annotation")     # drawn as bands; requests and user_metadata spans are not
MAX_BANDS = 40                           # per figure; the longest phases are drawn, a note counts the rest
MAX_BAND_LEGEND = 10                     # phase names with a legend entry
SERIES_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


def escape(text: str) -> str:
    """Text made safe for a plotly label or hover (plotly interprets <br>, <b>, <a href=…> in text)."""
    return html.escape(text, quote=False)


def category_color(category: str, known: Sequence[str] = ()) -> str:
    """The colour of a category: fixed for shipped ones, else by its position among `known` extra names."""
    if category in CATEGORY_COLORS:
        return CATEGORY_COLORS[category]
    extra = sorted(c for c in set(known) | {category} if c not in CATEGORY_COLORS)
    return FALLBACK_COLORS[extra.index(category) % len(FALLBACK_COLORS)]


def frame_label(frame: tuple[str, int, str]) -> str:
    """'function (pkg/file.py:line)' for a Python frame, the bare symbol for a C++ frame."""
    filename, line, name = frame
    if is_python_frame(filename):
        return f"{name} ({short_path(filename)}:{line})"
    return cpp_symbol(name)


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

def envelope_indices(values: np.ndarray, buckets: int) -> np.ndarray:
    """Indices that keep the shape of `values` with at most 2 × `buckets` points, ascending.

    All indices when the series is short; else the position of the minimum and of the maximum of each of
    `buckets` equal runs of indices, so every spike and dip reaches the plot at its exact value."""
    n = len(values)
    if buckets < 1:
        raise ValueError("buckets must be at least 1")
    if n <= 2 * buckets:
        return np.arange(n, dtype=np.int64)
    width = -(-n // buckets)
    padded = np.concatenate([values, np.full(width * buckets - n, values[-1], dtype=values.dtype)])
    rows = padded.reshape(buckets, width)
    starts = np.arange(buckets, dtype=np.int64) * width
    picks = np.concatenate([starts + rows.argmin(axis=1), starts + rows.argmax(axis=1), [0, n - 1]])
    return np.unique(np.minimum(picks, n - 1))


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
            text=_spread_labels(axis.x(dt, idx), [f"peak {int(r)}" for r in peak_rows["rank"]], _span(dt, axis)),
            textposition="top center", marker={"color": CURVE_COLORS["peak"], "size": 9, "symbol": "diamond"},
            hovertext=[f"peak {int(r.rank)}: {fmt_bytes(int(r.active_bytes))} active ({int(r.active_bytes):,} B)"
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
        _add_bands(fig, dt, axis, phases, max_bands)
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
    """'prefill #2' when a phase name occurs more than once on the device, else the bare name."""
    counts = rows["phase"].value_counts()
    return [f"{p} #{int(o)}" if counts[p] > 1 else str(p) for p, o in zip(rows["phase"], rows["occurrence"])]


def _add_bands(fig: go.Figure, dt: DeviceTimeline, axis: TimeAxis, phases: pd.DataFrame, max_bands: int) -> None:
    rows = phases[(phases["device"] == dt.device) & phases["kind"].isin(BAND_KINDS)]
    if not len(rows) or len(dt) == 0:
        return
    span = _span(dt, axis)
    bands = []
    for r, name in zip(rows.itertuples(index=False), _phase_names(rows)):
        lo, hi = int(r.start_index), int(r.end_index)
        if axis.origin_us is None:                       # no timestamps: x is the event index
            x0, x1 = float(max(lo, 0)), float(max(hi, 0))
        else:                                            # a span open at either end runs to the window's edge
            x0 = 0.0 if pd.isna(r.start_us) else max(0.0, (int(r.start_us) - axis.origin_us) / axis.scale)
            x1 = span if pd.isna(r.end_us) else min(span, (int(r.end_us) - axis.origin_us) / axis.scale)
        if x1 < x0:
            continue
        bands.append((x0, x1, str(r.phase), name))
    drawn = sorted(bands, key=lambda b: (-(b[1] - b[0]), b[0], b[3]))[:max_bands]
    drawn.sort(key=lambda b: (b[0], -(b[1] - b[0]), b[3]))
    colors: dict[str, str] = {}
    for _, _, phase, _ in sorted(bands, key=lambda b: (b[0], b[3])):
        colors.setdefault(phase, PHASE_COLORS[len(colors) % len(PHASE_COLORS)])
    labels = _spread_labels(np.array([b[0] for b in drawn], dtype=np.float64), [b[3] for b in drawn], span, 0.06)
    legend: set[str] = set()
    for (x0, x1, phase, _), label in zip(drawn, labels):
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
    if len(bands) > len(drawn):
        fig.add_annotation(x=1, y=0, xref="paper", yref="paper", showarrow=False, xanchor="right",
                           yanchor="bottom", font={"size": 10, "color": "#6b6b70"},
                           text=f"{len(bands) - len(drawn)} shorter phases not drawn")


def categories_figure(series: pd.DataFrame, timeline: Timeline, device: int, order: Sequence[str] = (),
                      marks: Sequence[tuple[int, str]] = (), height: int = 380) -> go.Figure:
    """Stacked bytes per category of `device` at the sampled instants of `series` (`categories_over_time`).

    `order` lists categories bottom first (unlisted ones follow by name); `marks` are (event index, label)
    pairs drawn as vertical lines (peaks, OOMs)."""
    dt = timeline[device]
    axis = time_axis(dt)
    part = series[series["device"] == device]
    present = list(dict.fromkeys(part["category"]))
    stacked = [c for c in order if c in present] + sorted(c for c in present if c not in order)
    fig = go.Figure(layout={"template": TEMPLATE, "height": height,
                            "xaxis": {"title": {"text": axis.title}},
                            "yaxis": {"title": {"text": "GiB live"}, "rangemode": "tozero"},
                            "hovermode": "x unified"})
    for category in stacked:
        rows = part[part["category"] == category].sort_values("event_index", kind="stable")
        idx = rows["event_index"].to_numpy(dtype=np.int64)
        color = category_color(category, present)
        fig.add_trace(go.Scatter(
            x=axis.x(dt, idx), y=rows["bytes"].to_numpy(dtype=np.float64) / GiB, name=category,
            mode="lines", stackgroup="categories", line={"width": 0.5, "color": color}, fillcolor=color,
            customdata=idx, hovertemplate=f"{escape(category)}: %{{y:.3f}} GiB<extra></extra>"))
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


def _spread_labels(xs: np.ndarray, labels: list[str], span: float, gap: float = 0.03) -> list[str]:
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
    for (category, stack_id), size in grouped.items():
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
            if fid not in frame_names:
                frame_names[fid] = label(snapshot.interner.frames[fid])
            path.append(fid)
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
        text = node.frames[-1] if len(node.frames) == 1 else \
            f"{node.frames[-1]} (+{len(node.frames) - 1} frame{'s' if len(node.frames) > 2 else ''})"
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

    root_id = emit(root, "", "#ffffff")
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
        sort=False, root={"color": "#ffffff"}),
        layout={"template": TEMPLATE, "height": height, "margin": {"l": 10, "r": 10, "t": 30, "b": 10}})
    return fig
