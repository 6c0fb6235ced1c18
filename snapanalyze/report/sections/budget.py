"""Serving budget: the engine's memory budget (`report --engine-log`) beside what each reported snapshot
measured — the `budget` command's `BudgetCheck`, read from `report.budget`; None without one."""

from __future__ import annotations

from markupsafe import Markup

from ...analyze.budget import BudgetCheck, ShapeCheck
from ...units import fmt_bytes
from ..budget_documents import arithmetic
from ..budget_terminal import (
    ENGINE_NAMES,
    PART_NAMES,
    SOURCES,
    VERDICTS,
    notes_of,
    part_value,
    setting_change,
    signed,
)
from ..context import Report
from ..templating import render
from .section import ORDER, Section


def budget_body(check: BudgetCheck, source: str) -> Markup:
    """The budget check as HTML: the engine's parts, each measured input, the settings that fit."""
    b = check.budget
    parts = [{"name": PART_NAMES.get(p.name, p.name), "value": part_value(p, b.ratio, precision=False),
              "source": SOURCES.get(p.source, p.source) + (f": {p.detail}" if p.source == "derived" else "")}
             for p in b.parts]
    shapes = [{"label": s.label, "forward": fmt_bytes(s.activation_bytes), "over_budget": signed(s.over_budget_bytes),
               "reserved": fmt_bytes(s.reserved_bytes), "over_device": signed(s.over_device_bytes),
               "verdict": VERDICTS[s.verdict], "made": ", ".join(f"{c} {fmt_bytes(n)}" for c, n in s.categories[:4]),
               "outside": _outside(s)} for s in check.shapes]
    settings = [{**dict(zip(("change", "kv"), setting_change(s))), "arithmetic": arithmetic(check, s)}
                for s in check.settings]
    return render("sections/budget.html.j2", engine=ENGINE_NAMES.get(b.engine, b.engine), source=source,
                  activation=part_value(b.activation, precision=False),
                  capacity=part_value(b.capacity, precision=False), capacity_exact=b.capacity_exact,
                  parts=parts, shapes=shapes, settings=settings, notes=notes_of(check),
                  outside=any(s.outside_bytes is not None for s in check.shapes))


def _outside(s: ShapeCheck) -> str:
    """A shape's memory outside the allocator as NVML saw it, and against what the budget leaves for it."""
    if s.outside_bytes is None:
        return "–"
    how = "" if s.outside_measured else " (est.)"
    over = s.outside_over_bytes
    return fmt_bytes(s.outside_bytes) + how + ("" if over is None else f" ({signed(over)} vs budget)")


def budget_section(report: Report) -> Section | None:
    check = report.budget
    if check is None:
        return None
    engine = ENGINE_NAMES.get(check.budget.engine, check.budget.engine)
    worst = check.exceeds
    verdict: tuple[str, ...] = ()
    if worst:
        over = max(worst, key=lambda s: s.over_device_bytes or s.over_budget_bytes or 0)
        what = ("the device" if over.verdict == "exceeds_device" else f"{engine}'s own budget")
        amount = over.over_device_bytes if over.verdict == "exceeds_device" else over.over_budget_bytes
        verdict = (f"{len(worst)} of {len(check.shapes)} measured inputs exceed {engine}'s memory budget; "
                   f"{over.label} exceeds {what} by {fmt_bytes(amount)}.",)
    body = budget_body(check, report.redactor.path(check.budget.source))
    return Section(id="budget", title="Serving engine budget", body=body, verdict=verdict, order=ORDER["budget"])
