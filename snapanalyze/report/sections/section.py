"""The types of the report's sections: `Section` (one part of the page), `FigureSpec` (one of its figures),
`SectionFunction` (what a section is made by) and `ORDER` / `VERDICT_FIRST` (where a section, and its verdict
sentences, go). The contract is in the package docstring (`report.sections`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import plotly.graph_objects as go
from markupsafe import Markup

from ..context import Report

ORDER = {"verdict": 0, "timelines": 20, "categories": 30, "instants": 40, "oom": 50, "budget": 55, "ranks": 60,
         "outside": 70, "diff": 80, "rules": 90, "facts": 100}
VERDICT_FIRST = ("oom",)      # sections whose verdict sentences open the folded details (then ORDER's order)


@dataclass(frozen=True)
class FigureSpec:
    """A figure of a section; `id` is its div id in the page (unique, stable for the same input)."""

    id: str
    figure: go.Figure


@dataclass(frozen=True)
class Section:
    """One part of the report (see the package docstring, `report.sections`)."""

    id: str
    title: str
    body: Markup = Markup("")
    figures: tuple[FigureSpec, ...] = ()
    verdict: tuple[str, ...] = ()
    order: int = 50


SectionFunction = Callable[[Report], "Section | None"]
