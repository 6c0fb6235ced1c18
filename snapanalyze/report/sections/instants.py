"""What held the memory at each detail instant (the peaks, or `--at`): the categories as a table with their
top sites, an icicle of the live stacks, and the segment map laid out there when there is one. An instant that
holds what an earlier one on its device held (the same largest site in every category, each category's bytes
within `SAME_SHARE` of the active bytes in all: the peaks of a periodic workload) keeps its exact table but
points to that instant's icicle instead of drawing a copy of it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ... import plots
from ..context import Report
from ..templating import render
from .phrases import phase_at
from .section import ORDER, FigureSpec, Section
from .view import category_rows, segment_rows

SAME_SHARE = 0.01     # categories that differ by less than this share of the active bytes draw the same icicle


def _same_stacks(rows: list[dict[str, Any]], earlier: list[dict[str, Any]], active: int) -> bool:
    """Whether two instants' category rows hold the same: every category's largest site is the same and the
    bytes differ by less than `SAME_SHARE` of `active`, summed over the categories."""
    mine = {r["category"]: (r["bytes"], r["sites"][0][0] if r["sites"] else "") for r in rows}
    theirs = {r["category"]: (r["bytes"], r["sites"][0][0] if r["sites"] else "") for r in earlier}
    if not mine or mine.keys() != theirs.keys() or any(mine[c][1] != theirs[c][1] for c in mine):
        return False
    return sum(abs(mine[c][0] - theirs[c][0]) for c in mine) < SAME_SHARE * max(active, 1)


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
            drawn: list[dict[str, Any]] = []               # the instants of this device with their own icicle
            for instant in view.details.get(device, []):
                attribution = view.attribution(device, instant.event_index)
                rows = category_rows(view, device, instant.event_index)
                active = dt.active_at(instant.event_index)
                same = next((d for d in drawn if _same_stacks(rows, d["rows"], active)), None)
                fig_id = f"fig-icicle-{view.key(device)}-{instant.slug}" if same is None else None
                if fig_id is not None:
                    figures.append(FigureSpec(fig_id, plots.icicle_figure(attribution, device,
                                                                          label=_labeller(label))))
                segments = segment_rows(view, device, instant.event_index,
                                        f"fig-segments-{view.key(device)}-{instant.slug}")
                if segments is not None:
                    figures.append(segments["spec"])
                shown = {
                    "device": device, "heading": view.heading(device), "label": instant.label,
                    "anchor": f"instant-{view.key(device)}-{instant.slug}",
                    "when": axis.describe(dt, instant.event_index), "figure": fig_id,
                    "same_as": None if same is None else {"label": same["label"], "anchor": same["anchor"]},
                    "phase": phase_at(view, device, instant.event_index),
                    "active": active, "reserved": dt.reserved_at(instant.event_index),
                    "baseline": dt.baseline_active, "request": attribution.instants[device].request,
                    "rows": rows, "segments": segments}
                instants.append(shown)
                if same is None:
                    drawn.append(shown)
    if not instants:
        return None
    body = render("sections/instants.html.j2", instants=instants, same_share=SAME_SHARE)
    return Section(id="instants", title="What held the memory", body=body, figures=tuple(figures),
                   order=ORDER["instants"])
