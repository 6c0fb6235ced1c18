"""Categories over time: live bytes per category after every event, from the attributions at the instants
where the live set changed most (and at every peak and OOM), stacked as steps, one figure per device."""

from __future__ import annotations

from ... import plots
from ..context import Report
from ..templating import render
from .section import ORDER, FigureSpec, Section


def categories_section(report: Report) -> Section | None:
    """Live bytes per category after every event (`category_curves`), stacked as steps, with the exact active
    curve over them, per device."""
    devices, figures = [], []
    for view in report.views:
        series = view.series
        if not len(series):
            continue
        order = [name for name, _ in sorted(view.rules.categories.items(),
                                            key=lambda kv: (-kv[1].precedence, kv[0]))]
        for device in view.devices:
            part = series[series["device"] == device]
            if not len(part) or len(view.timeline[device]) <= 1:
                continue                      # nothing over time without a trace (or a 1-entry legacy one)
            marks = [(i.event_index, i.label) for i in view.details.get(device, [])]
            ooms = view.snapshot.ooms
            marks += [(int(i), "OOM") for i in ooms.loc[ooms["device"] == device, "index"]]
            fig_id = f"fig-categories-{view.key(device)}"
            figure = plots.categories_figure(view.curves, view.timeline, device, order, marks)
            figures.append(FigureSpec(fig_id, figure))
            devices.append({"device": device, "heading": view.heading(device), "figure": fig_id,
                            "instants": int(part["event_index"].nunique()), "events": len(view.timeline[device])})
    if not devices:
        return None
    body = render("sections/categories.html.j2", devices=devices)
    return Section(id="categories", title="Categories over time", body=body, figures=tuple(figures),
                   order=ORDER["categories"])
