"""Serving budget: the engine's memory budget (`report --engine-log`) beside what each reported snapshot
measured — the `budget` command's document, read from `report.inputs["budget"]`; None without one."""

from __future__ import annotations

from typing import Any

from markupsafe import Markup

from ...units import fmt_bytes
from ..budget_terminal import (
    ENGINE_NAMES,
    NOTES,
    PART_NAMES,
    SOURCES,
    VERDICTS,
    part_value,
    setting_change,
    signed,
)
from ..context import Report
from ..templating import render
from .section import ORDER, Section


def budget_body(doc: dict[str, Any], source: str) -> Markup:
    """The budget document as HTML: the engine's parts, each measured input, the settings that fit."""
    b = doc["budget"]
    parts = [{"name": PART_NAMES.get(p["name"], p["name"]), "value": part_value(p, b["ratio"], precision=False),
              "source": SOURCES.get(p["source"], p["source"]) + (f": {p['detail']}" if p["source"] == "derived"
                                                                 else "")} for p in b["parts"]]
    shapes = [{"label": s["label"], "forward": fmt_bytes(s["activation_bytes"]), "over_budget": signed(
        s["over_budget_bytes"]), "reserved": fmt_bytes(s["reserved_bytes"]), "over_device": signed(
        s["over_device_bytes"]), "verdict": VERDICTS[s["verdict"]], "made": ", ".join(
        f"{c['category']} {fmt_bytes(c['bytes'])}" for c in s["categories"][:4]), "outside": _outside(s)}
        for s in doc["shapes"]]
    settings = [{**dict(zip(("change", "kv"), setting_change(s))), "arithmetic": s["arithmetic"]}
                for s in doc["settings"]]
    notes = [NOTES.get(n, n) for n in dict.fromkeys(doc["notes"] + b["notes"])]
    return render("sections/budget.html.j2", engine=ENGINE_NAMES.get(doc["engine"], doc["engine"]), source=source,
                  activation=part_value(b["activation"], precision=False),
                  capacity=part_value(b["capacity"], precision=False), capacity_exact=b["capacity_exact"],
                  parts=parts, shapes=shapes, settings=settings, notes=notes,
                  outside=any(s["outside_bytes"] is not None for s in doc["shapes"]))


def _outside(s: dict[str, Any]) -> str:
    """A shape's memory outside the allocator as NVML saw it, and against what the budget leaves for it."""
    if s["outside_bytes"] is None:
        return "–"
    how = "" if s["outside_measured"] else " (est.)"
    over = s["outside_over_bytes"]
    return fmt_bytes(s["outside_bytes"]) + how + ("" if over is None else f" ({signed(over)} vs budget)")


def budget_section(report: Report) -> Section | None:
    doc = report.inputs.get("budget")
    if not doc:
        return None
    engine = ENGINE_NAMES.get(doc["engine"], doc["engine"])
    worst = [s for s in doc["shapes"] if s["verdict"] in ("exceeds_device", "exceeds_budget")]
    verdict: tuple[str, ...] = ()
    if worst:
        over = max(worst, key=lambda s: s["over_device_bytes"] or s["over_budget_bytes"] or 0)
        what = ("the device" if over["verdict"] == "exceeds_device" else f"{engine}'s own budget")
        amount = over["over_device_bytes"] if over["verdict"] == "exceeds_device" else over["over_budget_bytes"]
        verdict = (f"{len(worst)} of {len(doc['shapes'])} measured inputs exceed {engine}'s memory budget; "
                   f"{over['label']} exceeds {what} by {fmt_bytes(amount)}.",)
    body = budget_body(doc, report.redactor.path(doc["source"]))
    return Section(id="budget", title="Serving engine budget", body=body, verdict=verdict, order=ORDER["budget"])
