"""Rules that fired: which rule claimed which frame at each detail instant (redacted when the report
redacts), and the rule files the report used."""

from __future__ import annotations

from ...analyze.attribute.compact import rule_firings
from ..context import Report
from ..templating import render
from .section import ORDER, Section


def rules_section(report: Report) -> Section | None:
    """Which rule fired on which frame at each detail instant, and where the rules came from."""
    groups = []
    for view in report.views:
        redactor = view.redactor
        for device in view.devices:
            for n, instant in enumerate(view.details.get(device, [])):
                records = [{**vars(r), "frame": redactor.site(r.frame), "reason": redactor.words(r.reason)}
                           for r in rule_firings(view.attribution(device, instant.event_index), device)]
                groups.append({"device": device, "heading": view.heading(device), "label": instant.label,
                               "open": n == 0, "records": records})
    if not groups:
        return None
    sources = [report.redactor.path(s) if not s.startswith("rulepacks/") else s for s in report.rules.sources]
    body = render("sections/rules.html.j2", groups=groups, sources=sources)
    return Section(id="rules", title="Rules that fired", body=body, order=ORDER["rules"])
