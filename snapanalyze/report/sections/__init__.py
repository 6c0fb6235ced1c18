"""Report sections: each a function from a Report to a Section (HTML fragment, figures, verdict lines).

Contract: a section function takes the `Report` and returns a `Section`, or None when it has nothing
to say for this input (no OOM entries, no second rank, …) — the report never shows an empty placeholder.
A Section carries a stable `id` (its anchor, and the prefix of its figures' ids), a `title`, a `body` (HTML
rendered with `templating.render`, so every value is escaped), its `figures` (plotly Figures, each placed in
the body with the `figure` macro of `macros.html.j2` under its id), `verdict` sentences (plain text, shown at
the top of the report in section order) and an `order` (see ORDER). `DEFAULT_SECTIONS` is what
`snapanalyze report` shows, for one snapshot and for a run directory alike.

Runs: the per-snapshot sections (timelines, categories, instants, OOM, rules, facts) repeat their content
for each view of `report.views` (a `RankView` per rank), under "Rank r, device d" headings and with ids
keyed by `view.key(device)` ("d0" for a lone snapshot, "r1-d0" for rank 1), so a lone snapshot's report is
the same as before runs existed. The run-level sections read `report.run` (the per-rank comparison), each
view's `outside` (memory outside the allocator at its peaks) and `report.diffs` (against a baseline); for a
lone snapshot they return None. Helpers of one view take the `RankView`.

Extension point: a later analysis plugs in by writing one more section function — reading its own inputs
from `report.inputs` (e.g. "path", the run directory) or computing from each view's `snapshot` — and passing
`sections=(*DEFAULT_SECTIONS, its_section)` to `html.render_report` / `html.build_report` (or adding it to
DEFAULT_SECTIONS once it applies to every report). Its `order` places it (ORDER reserves slots: ranks 60,
outside 70, diff 80), and its `verdict` sentences join the verdict at the top. Nothing else changes.

Layout: `section` holds the types and ORDER, `view` what the sections read from a view, `phrases` their
wording (above `view`), and one module per section (`verdict`, `timelines`, …, `diff`); imports run only
downwards (section modules → phrases → view → section), never between sections.
"""

from __future__ import annotations

from .budget import budget_section
from .categories import categories_section
from .diff import MAX_DIFF_STACKS, diff_section
from .facts import facts_section
from .instants import instants_section
from .oom import oom_section
from .outside import outside_section
from .phrases import INFERRED_NOTE, OOM_REASONS, VERDICT_NAMES, WHAT_OUTSIDE, phase_at, when_in_window
from .ranks import ranks_section
from .rules import rules_section
from .section import ORDER, VERDICT_FIRST, FigureSpec, Section, SectionFunction
from .timelines import MAX_PHASE_ROWS, timelines_section
from .verdict import peak_sentences, verdict_section
from .view import category_rows, segment_rows

__all__ = [
    "DEFAULT_SECTIONS", "INFERRED_NOTE", "MAX_DIFF_STACKS", "MAX_PHASE_ROWS", "OOM_REASONS", "ORDER", "VERDICT_FIRST",
    "VERDICT_NAMES", "WHAT_OUTSIDE", "FigureSpec", "Section", "SectionFunction", "categories_section",
    "category_rows", "diff_section", "facts_section", "instants_section", "oom_section",
    "outside_section", "peak_sentences", "phase_at", "ranks_section", "rules_section", "segment_rows",
    "timelines_section", "verdict_section", "when_in_window", "budget_section",
]

DEFAULT_SECTIONS: tuple[SectionFunction, ...] = (
    verdict_section, timelines_section, categories_section, instants_section, oom_section, budget_section,
    ranks_section, outside_section, diff_section, rules_section, facts_section,
)
