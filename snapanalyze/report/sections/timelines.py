"""Memory over time: active, reserved and allocated (estimate) bytes per device with the peaks and OOM entries
marked, a table of the peaks, and — where there are markers or annotations — the phases as bands with their
table (the largest transients when there are many); for a rank of a run also NVML used."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ... import plots
from ..context import RankView, Report
from ..templating import render
from .phrases import phase_at
from .section import ORDER, FigureSpec, Section
from .view import _instant_anchor, _phase_label, _window

MAX_PHASE_ROWS = 30           # phases listed per device (the largest transients when there are more)


def _phase_rows(view: RankView, device: int) -> tuple[list[dict[str, Any]], int]:
    """The phases table of one device (at most MAX_PHASE_ROWS, the largest transients) and how many were left."""
    table = view.phases
    rows = table[table["device"] == device] if len(table) else table
    if not len(rows):
        return [], 0
    shown = rows
    if len(rows) > MAX_PHASE_ROWS:
        shown = rows.sort_values(["transient_bytes", "start_index"], ascending=[False, True],
                                 kind="stable").head(MAX_PHASE_ROWS).sort_index()
    out = []
    for r in shown.itertuples(index=False):
        same_kind = rows[rows["kind"] == r.kind]
        events = (f"{int(r.start_index):,}–{int(r.end_index):,}" if int(r.end_index) >= int(r.start_index)
                  else "no events")
        out.append({"name": _phase_label(same_kind, r), "kind": r.kind, "events": events,
                    "before": int(r.before_bytes), "peak": int(r.peak_bytes), "transient": int(r.transient_bytes),
                    "after": int(r.after_bytes),
                    "categories": list(zip(r.top_categories, r.top_category_bytes, r.top_category_inferred_bytes)),
                    "flags": [f for f, on in (("clipped", r.clipped), ("open", r.open)) if on],
                    "anchor": _instant_anchor(view, device, int(r.peak_index))})
    return out, len(rows) - len(shown)


def timelines_section(report: Report) -> Section | None:
    """Active, reserved and allocated (estimate) bytes per device, peaks and OOM entries marked; for a rank of
    a run also NVML used, and the phases as bands with their table."""
    devices, figures = [], []
    for view in report.views:
        ooms = view.snapshot.ooms
        nvml = view.rank.nvml if view.rank is not None and len(view.rank.nvml) else None
        for device in view.devices:
            dt = view.timeline[device]
            if len(dt) <= 1:
                continue                      # a state without a trace (or a 1-entry legacy one) has no time to draw
                                              # (a single point on a hairline axis): Out of memory says so
            axis = plots.time_axis(dt)
            fig_id = f"fig-timeline-{view.key(device)}"
            figures.append(FigureSpec(fig_id, plots.timeline_figure(
                view.timeline, device, view.peaks, ooms, nvml=nvml,
                phases=view.phases if len(view.phases) else None)))
            rows = []
            for r in view.peaks[view.peaks["device"] == device].itertuples():
                rows.append({"peak": int(r.peak), "when": axis.describe(dt, int(r.event_index)),
                             "active": int(r.active_bytes), "reserved": int(r.reserved_bytes),
                             "allocated_est": int(r.allocated_est_bytes), "transient": int(r.transient_bytes),
                             "held": None if pd.isna(r.duration_us) else int(r.duration_us),
                             "phase": phase_at(view, device, int(r.event_index))})
            window, events = _window(view, device)
            phases, more = _phase_rows(view, device)
            sampled = None
            if nvml is not None:
                t = plots.nvml_in_window(dt, nvml)["time_us"]
                inside = int(((t >= dt.time_at(0)) & (t <= dt.time_at(len(dt) - 1))).sum()) if len(t) else 0
                sampled = {"samples": inside, "interval_ms": view.rank.interval_ms if view.rank else None}
            devices.append({"device": device, "heading": view.heading(device), "figure": fig_id, "peaks": rows,
                            "events": events, "window": window, "downsampled": len(dt) > plots.TIMELINE_MAX_POINTS,
                            "baseline": dt.baseline_active, "phases": phases, "more_phases": more,
                            "nvml": sampled, "bands": bool(len(view.phases))})
    if not devices:
        return None
    body = render("sections/timelines.html.j2", devices=devices)
    return Section(id="timelines", title="Memory over time", body=body, figures=tuple(figures),
                   order=ORDER["timelines"])
