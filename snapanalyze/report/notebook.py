"""Notebook display: compact HTML summary tables for a Snapshot, a Timeline and an Attribution.

Contract: `snapshot_html`, `timeline_html` and `attribution_html` return a small HTML fragment (a heading
line and one table, rendered from `templates/notebook/` with every value escaped) that Jupyter shows for
the object through its `_repr_html_` (`display.HtmlDisplay`: importing this module registers them). They
never include plotly.js or a figure (plots are `snapanalyze.plots`
functions that return Figures), read only what the object already holds — no replay, no attribution (an
Attribution shows its typed result, `attribution_result`, as the terminal does) — and stay small whatever the
trace size.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..analyze.peaks import global_peak_index
from ..display import register
from ..model import ACTIVE_STATES, Snapshot
from ..replay import Timeline
from .templating import render


def _window_us(time_us: np.ndarray | None) -> int | None:
    if time_us is None or len(time_us) == 0:
        return None
    return int(time_us[-1]) - int(time_us[0])


def snapshot_html(snapshot: Snapshot) -> str:
    """Source, container, and per device: events, window, segments, reserved bytes, active blocks, OOMs."""
    segments, blocks, ooms = snapshot.segments, snapshot.blocks, snapshot.ooms
    rows = []
    for device in snapshot.devices:
        trace = snapshot.trace(device)
        on_device = segments["device"].to_numpy() == device
        active = (blocks["device"].to_numpy() == device) & blocks["state"].isin(ACTIVE_STATES).to_numpy()
        rows.append({"device": device, "events": len(trace), "window": _window_us(trace.time_us),
                     "segments": int(on_device.sum()),
                     "reserved": int(segments["total_size"].to_numpy()[on_device].sum()),
                     "active_blocks": int(active.sum()),
                     "ooms": int((ooms["device"].to_numpy() == device).sum()) if len(ooms) else 0})
    return str(render("notebook/snapshot.html.j2", source=snapshot.source, container=snapshot.format.container,
                      rows=rows))


def timeline_html(timeline: Timeline) -> str:
    """Per device: events, baseline, the global peak of active bytes and where, maximum reserved, replay check."""
    rows = []
    for device, dt in sorted(timeline.devices.items()):
        n = len(dt)
        peak_index = global_peak_index(dt)
        peak = dt.active_at(peak_index)
        rows.append({"device": device, "events": n, "window": _window_us(dt.time_us),
                     "baseline": dt.baseline_active, "peak": peak, "peak_index": peak_index,
                     "allocated_est": dt.allocated_est_at(peak_index),
                     "max_reserved": max(int(dt.reserved.max()) if n else 0, dt.baseline_reserved),
                     "problems": len(dt.problems)})
    return str(render("notebook/timeline.html.j2", source=timeline.snapshot.source, rows=rows))


def attribution_html(attribution: Any, top: int = 1) -> str:
    """The attribute command's typed result (`attribution_result`), as the terminal shows it: per device the
    instant (label, event, active and reserved bytes), then bytes per category (flagged "inferred" where
    sizes, lifetimes or layout decided rather than a frame) with the `top` allocation sites of each, the
    forward-pass tensors kept across training steps, and the attribution's notes."""
    from ..analyze.attribute.compact import attribution_result
    from ..sites import NO_FRAMES, site_text
    from .oom_text import kept_words

    result = attribution_result(attribution)
    kept = {d.device: kept_words(d.kept, f"at the {d.instant}") if d.kept is not None else ""
            for d in result.devices}
    return str(render("notebook/attribution.html.j2", source=result.source, devices=result.devices, top=top,
                      zip=zip, kept=kept, notes=list(result.notes),
                      site=lambda s: site_text(s, none=NO_FRAMES)))


def budget_html(check: Any) -> str:
    """A `BudgetCheck` as the report's budget section shows it."""
    from .sections.budget import budget_body

    return str(budget_body(check, check.budget.source))


register("Snapshot", snapshot_html)
register("BudgetCheck", budget_html)
register("Timeline", timeline_html)
register("Attribution", attribution_html)
