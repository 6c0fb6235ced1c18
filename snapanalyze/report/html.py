"""The HTML postmortem: sections → one self-contained, deterministic HTML string.

Contract: `render_report(report, sections)` calls each section function on the `context.Report`, drops those
that return None, orders the rest by (`order`, position) and returns one HTML page: at the top the verdict —
the "verdict" section's body (headline, a line per device, advice), then every section's verdict sentences
folded in a <details> (those of VERDICT_FIRST's sections first, the rest in order) — and below it the other
sections; plotly.js inlined once (`plotly.offline.get_plotlyjs()`, no CDN, no network — a
Content-Security-Policy forbids every fetch), each figure's data in its own
`<script type="application/json">` block serialised by `script_json` (sorted keys; `<`, `>`, `&`, U+2028/9
escaped, so a frame named `</script>` cannot end the block) and drawn by a small inline script. The page
holds no generation time or random ids: the same input gives the same bytes. It never embeds the raw trace:
timelines are min/max envelopes, attributions are per category and per stack (see `plots`).
`build_report(snapshot, …)` is `build_context` + `render_report`; `build_path_report(path, …)` is
`build_path_context` + `render_report` for what a user names — a snapshot file, or a run directory, whose
report covers every rank (see `context`) — optionally diffed against a baseline (`compare`).
`normalise(html)` replaces the plotly.js body and the version with markers and pretty-prints the JSON
blocks, for golden-file comparison. Nothing here writes files or prints.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import plotly.offline
from markupsafe import Markup

from .. import __version__
from ..analyze.budget import BudgetCheck
from ..analyze.rules import RuleSet, shipped_rules
from ..model import Snapshot
from ..replay import Timeline
from ..session.inputs import SourceRoots
from ..units import fmt_count
from .context import Progress, Report, ReportOptions, build_context, build_path_context
from .sections import DEFAULT_SECTIONS, VERDICT_FIRST, Section, SectionFunction
from .templating import render

PLOTLY_MARKER = "/* plotly.js inlined here */"
VERSION_MARKER = "{version}"
_SCRIPT_DATA = re.compile(r'(<script type="application/json" id="[^"]*">)(.*?)(</script>)', re.S)


def script_json(value: Any) -> str:
    """JSON for inside a <script> element: sorted keys, compact, and no '<', '>', '&', U+2028/U+2029 left raw."""
    return _escape(json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False))


def _escape(text: str) -> str:
    return (text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def figure_json(figure: Any) -> str:
    """A plotly Figure as `script_json` text: {"data": [...], "layout": {...}} (arrays as typed-array blocks)."""
    spec = json.loads(figure.to_json())
    return script_json({"data": spec.get("data", []), "layout": spec.get("layout", {})})


def plotly_js() -> str:
    """The plotly.js bundle that ships with the installed plotly, safe to place inside one <script>."""
    js = plotly.offline.get_plotlyjs()
    return js.replace("</script", "<\\/script").replace("<!--", "<\\!--")


def collect_sections(report: Report, sections: Sequence[SectionFunction]) -> list[Section]:
    """The sections that have something to say, in (order, position) order; ids must be unique."""
    made = [(i, s) for i, fn in enumerate(sections) if (s := fn(report)) is not None]
    made.sort(key=lambda item: (item[1].order, item[0]))
    seen: set[str] = set()
    for _, section in made:
        ids = [section.id, *(f.id for f in section.figures)]
        clash = seen.intersection(ids)
        if clash or len(set(ids)) != len(ids):
            raise ValueError(f"report section {section.id!r}: duplicate id(s) {sorted(clash) or ids}")
        seen.update(ids)
        for figure in section.figures:
            if f'id="{figure.id}"' not in section.body:
                raise ValueError(f"report section {section.id!r}: figure {figure.id!r} is not placed in its body")
    return [s for _, s in made]


def render_report(report: Report, sections: Sequence[SectionFunction] = DEFAULT_SECTIONS,
                  progress: Progress | None = None) -> str:
    """One HTML page from `sections` applied to `report` (see the module docstring)."""
    (progress or (lambda _: None))("rendering")
    made = collect_sections(report, sections)
    head = next((s for s in made if s.id == "verdict"), None)
    detailed = sorted(made, key=lambda s: s.id not in VERDICT_FIRST)          # stable: else in section order
    verdict = [line for s in detailed for line in s.verdict]
    shown = [s for s in made if (s.body or s.figures) and s is not head]
    figures = [{"id": f.id, "json": Markup(figure_json(f.figure))} for s in shown for f in s.figures]
    views = report.views
    devices = sum(len(v.devices) for v in views)
    events = sum(len(v.timeline[d]) for v in views for d in v.devices)
    subtitle = f"{fmt_count(devices, 'device')}, {fmt_count(events, 'event')}"
    if report.run is not None and len(report.run.ranks) > 1:
        ranks = report.run.ranks
        subtitle = f"{len(ranks)} ranks ({', '.join(map(str, ranks))}), " + subtitle
        tags = sorted({v.rank.tag for v in views if v.rank is not None and v.rank.tag})
        subtitle += f", tag {', '.join(tags)}" if tags else ""
    else:
        rank, tag = report.inputs.get("rank"), report.inputs.get("tag")
        if rank is not None or tag is not None:
            subtitle += "".join(f", {k} {v}" for k, v in (("rank", rank), ("tag", tag)) if v is not None)
    if report.diffs:
        subtitle += f", compared with {report.redactor.path(report.diffs[0].baseline)}"
    return str(render("report.html.j2", title="GPU memory postmortem", source=report.source, subtitle=subtitle,
                      version=__version__, verdict_head=head.body if head is not None else Markup(""),
                      verdict=verdict, sections=shown, figures=figures,
                      plotly_js=Markup(plotly_js())))


def build_report(snapshot: Snapshot, timeline: Timeline | None = None, rules: RuleSet | None = None,
                 top: int = 3, at: Sequence[str] = (), samples: int = 32, device: int | None = None,
                 redact_paths: bool = False, inputs: Mapping[str, Any] | None = None,
                 sections: Sequence[SectionFunction] = DEFAULT_SECTIONS, progress: Progress | None = None) -> str:
    """The HTML report of one snapshot: `build_context(...)` then `render_report(...)` (its frames resolved
    with the source it carries: see `attribute`)."""
    rules = rules or shipped_rules()
    options = ReportOptions(top=top, at=tuple(at), samples=samples, device=device, redact_paths=redact_paths)
    report = build_context(snapshot, timeline=timeline, rules=rules, options=options, inputs=inputs,
                           progress=progress)
    return render_report(report, sections, progress)


def build_path_report(path: str | Path, rank: int | None = None, tag: str | None = None,
                      compare: str | Path | None = None, rules: RuleSet | None = None, top: int = 3,
                      at: Sequence[str] = (), samples: int = 32, device: int | None = None,
                      redact_paths: bool = False, sections: Sequence[SectionFunction] = DEFAULT_SECTIONS,
                      progress: Progress | None = None, capacity: int | None = None,
                      source: SourceRoots = None, executor: Executor | None = None,
                      budget: BudgetCheck | None = None) -> str:
    """The HTML report of a snapshot file or a run directory (every rank, or `rank`), optionally with the
    diff against the baseline `compare`: `build_path_context(...)` then `render_report(...)`; `executor`
    measures a large run's ranks for the comparison (`context.build_run_context`); `source`: the program's
    checkout, each snapshot's frames resolved with it as it loads (`load`); `budget`: the `budget` command's
    check of this input (`report --engine-log`), shown in its own section."""
    rules = rules or shipped_rules()
    options = ReportOptions(top=top, at=tuple(at), samples=samples, device=device, redact_paths=redact_paths,
                            capacity=capacity)
    report = build_path_context(path, rank=rank, tag=tag, compare=compare, rules=rules, options=options,
                                progress=progress, executor=executor, source=source)
    if budget is not None:
        report = dataclasses.replace(report, budget=budget)
    return render_report(report, sections, progress)


def normalise(page: str) -> str:
    """A report with the plotly.js body and the snapanalyze version replaced by markers and every JSON
    block pretty-printed (one key per line), so two reports compare line by line."""
    start = page.index("<script>", page.index("</main>"))
    end = page.index("</script>", start)
    page = page[:start + len("<script>")] + PLOTLY_MARKER + page[end:]
    page = page.replace(f"snapanalyze {__version__}", f"snapanalyze {VERSION_MARKER}")

    def pretty(m: re.Match[str]) -> str:
        value = json.loads(m.group(2))
        return m.group(1) + "\n" + script_json_pretty(value) + "\n" + m.group(3)

    return _SCRIPT_DATA.sub(pretty, page)


def script_json_pretty(value: Any) -> str:
    """`script_json`, indented one space per level (for golden files)."""
    return _escape(json.dumps(value, sort_keys=True, indent=1, ensure_ascii=False, allow_nan=False))
