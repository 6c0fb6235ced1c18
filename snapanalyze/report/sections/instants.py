"""What held the memory at each detail instant (the peaks, or `--at`): the categories as a table with their
top sites, an icicle of the live stacks, and the segment map laid out there when there is one."""

from __future__ import annotations

from collections.abc import Callable

from ... import plots
from ..context import Report
from ..templating import render
from .phrases import phase_at
from .section import ORDER, FigureSpec, Section
from .view import category_rows, segment_rows


def _labeller(redact: Callable[[tuple[str, int, str]], tuple[str, int, str]]) -> plots.FrameLabel:
    """An icicle frame label that shows the frame redacted (when the report redacts)."""
    return lambda frame: plots.frame_label(redact(frame))


def instants_section(report: Report) -> Section | None:
    """At each peak (or `--at` instant): what held the memory, as a table and an icicle of the live stacks."""
    instants, figures = [], []
    for view in report.views:
        label = view.redactor.frame
        for device in view.devices:
            dt = view.timeline[device]
            axis = plots.time_axis(dt)
            for instant in view.details.get(device, []):
                attribution = view.attribution(device, instant.event_index)
                fig_id = f"fig-icicle-{view.key(device)}-{instant.slug}"
                figures.append(FigureSpec(fig_id, plots.icicle_figure(attribution, device, label=_labeller(label))))
                segments = segment_rows(view, device, instant.event_index,
                                        f"fig-segments-{view.key(device)}-{instant.slug}")
                if segments is not None:
                    figures.append(segments["spec"])
                instants.append({
                    "device": device, "heading": view.heading(device), "label": instant.label,
                    "anchor": f"instant-{view.key(device)}-{instant.slug}",
                    "when": axis.describe(dt, instant.event_index), "figure": fig_id,
                    "phase": phase_at(view, device, instant.event_index),
                    "active": dt.active_at(instant.event_index), "reserved": dt.reserved_at(instant.event_index),
                    "baseline": dt.baseline_active, "request": attribution.instants[device].request,
                    "rows": category_rows(view, device, instant.event_index), "segments": segments})
    if not instants:
        return None
    body = render("sections/instants.html.j2", instants=instants)
    return Section(id="instants", title="What held the memory", body=body, figures=tuple(figures),
                   order=ORDER["instants"])
