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
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from markupsafe import Markup

from .. import plots
from ..analyze.attribute import PERSISTENT_CATEGORIES as PERSISTENT
from ..analyze.engine import Engine, detect_engine
from ..analyze.summary import summarize
from ..units import fmt_bytes, fmt_count, fmt_duration_us, fmt_share, fmt_signed_bytes
from . import oom_text
from .compare_documents import diff_document
from .context import DetailInstant, RankView, Report
from .documents import explain_records
from .templating import render

ORDER = {"verdict": 0, "timelines": 20, "categories": 30, "instants": 40, "oom": 50, "ranks": 60,
         "outside": 70, "diff": 80, "rules": 90, "facts": 100}
# Categories an engine holds for its whole life; the verdict names the others (what the step put on top).
MAX_PHASE_ROWS = 30           # phases listed per device (the largest transients when there are more)
MAX_DIFF_STACKS = 15          # changed stacks listed per diff (the largest changes)
VERDICT_NAMES = {"fragmentation": "fragmentation", "live_exhaustion": "live memory exhaustion",
                 "outside_pressure": "pressure from outside the allocator", "unexplained": "unexplained"}


@dataclass(frozen=True)
class FigureSpec:
    """A figure of a section; `id` is its div id in the page (unique, stable for the same input)."""

    id: str
    figure: go.Figure


@dataclass(frozen=True)
class Section:
    """One part of the report (see the module docstring)."""

    id: str
    title: str
    body: Markup = Markup("")
    figures: tuple[FigureSpec, ...] = ()
    verdict: tuple[str, ...] = ()
    order: int = 50


SectionFunction = Callable[[Report], "Section | None"]


# -- helpers ------------------------------------------------------------------------------------------------

def _join(parts: list[str]) -> str:
    if len(parts) <= 1:
        return "".join(parts)
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def _signed(n: int) -> str:
    return fmt_signed_bytes(n)


def _category_phrase(category: str, size: int, inferred: int) -> str:
    text = f"{fmt_bytes(size)} {category}"
    if category == "other":
        text += " (matched no rule)"
    if inferred and inferred >= size:
        text += " (inferred, not proven by a frame)"
    elif inferred:
        text += f" ({fmt_bytes(inferred)} of it inferred, not proven by a frame)"
    return text


def category_rows(view: RankView, device: int, event_index: int) -> list[dict[str, Any]]:
    """The attribution summary of one instant as template rows (top sites redacted when asked)."""
    attribution = view.attribution(device, event_index)
    summary = attribution.summary[attribution.summary["device"] == device]
    blocks = attribution.blocks[attribution.blocks["device"] == device]
    inferred = blocks[blocks["inferred"].astype(bool)].groupby("category")["size"].sum()
    # Each category's largest owner: the code that made most of its bytes (named where the category is `other`
    # or inferred, so that a reader knows whose bytes they are).
    by_owner = blocks[blocks["owner"] != ""].groupby(["category", "owner"], sort=False)["size"].sum()
    top_owner = by_owner.sort_values(ascending=False, kind="stable").groupby(level=0, sort=False).head(1)
    owners = {cat: (owner, int(n)) for (cat, owner), n in top_owner.items()}
    label = view.redactor.label
    known = list(view.rules.categories)
    return [{"category": r.category, "bytes": int(r.bytes), "share": float(r.share), "blocks": int(r.blocks),
             "inferred": int(inferred.get(r.category, 0)), "color": plots.category_color(r.category, known),
             "sites": [(label(site), int(n)) for site, n in zip(r.top_frames, r.top_frame_bytes)],
             "owner": label(owners[r.category][0]) if r.category in owners else "",
             "owner_bytes": owners[r.category][1] if r.category in owners else 0}
            for r in summary.itertuples()]


def _window(view: RankView, device: int) -> tuple[int | None, int]:
    """(window length in µs or None, number of events) of a device."""
    dt = view.timeline[device]
    first, last = dt.time_at(0), dt.time_at(len(dt) - 1)
    return ((last - first) if first is not None and last is not None else None), len(dt)


def when_in_window(view: RankView, device: int, index: int) -> str:
    """'at 2.38 ms into the 2.41 ms window (event 598 of 619)', or 'at event 598 of 619' without times."""
    dt = view.timeline[device]
    window, events = _window(view, device)
    event = "before the first event" if index < 0 else f"event {index:,} of {events:,}"
    t, first = dt.time_at(index), dt.time_at(0)
    if window is None or t is None or first is None:
        if index < 0:
            return "at the start of the window"
        return f"at {event}" + (" (the trace has no timestamps)" if window is None else "")
    return f"at {fmt_duration_us(t - first)} into the {fmt_duration_us(window)} window ({event})"


def _phase_label(rows: pd.DataFrame, row: Any) -> str:
    """The phase's name as `snapanalyze phases` prints it and --phase accepts it: 'prefill#2' when the name
    is repeated, else 'prefill' (`analyze.phases.phase_label`)."""
    return str(row.label)


def phase_at(view: RankView, device: int, index: int) -> str | None:
    """'during prefill #1 (request req-1)': the innermost phase (markers or record_function annotations) and
    the requests whose span holds event `index` of `device`; None when no span holds it."""
    table = view.phases
    if not len(table) or index < 0:
        return None
    rows = table[table["device"] == device]
    inside = rows[(rows["start_index"] <= index) & (rows["end_index"] >= index)]
    phases = inside[inside["kind"].isin(plots.BAND_KINDS)]
    requests = inside[inside["kind"] == "request"]
    parts = []
    if len(phases):
        best = phases.sort_values(["start_index", "end_index"], ascending=[False, True], kind="stable").iloc[0]
        parts.append(_phase_label(rows[rows["kind"].isin(plots.BAND_KINDS)], best))
    names = [str(n) for n in dict.fromkeys(requests["phase"])]
    if names:
        shown = _join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        text = f"request{'s' if len(names) > 1 else ''} {shown}"
        parts.append(f"({text})" if parts else text)
    return "during " + " ".join(parts) if parts else None


def peak_sentences(view: RankView, instant: DetailInstant) -> list[str]:
    """Plain sentences with numbers about one attributed instant: how high, when, during which phase, what
    held it and how much of it was live before the window (nothing said when nothing was: the verdict says
    that once for every device, `verdict_section`)."""
    device, index = instant.device, instant.event_index
    dt = view.timeline[device]
    active, reserved = dt.active_at(index), dt.reserved_at(index)
    when = when_in_window(view, device, index)
    phase = phase_at(view, device, index)
    when += f", {phase}" if phase else ""
    where = view.where(device)
    if instant.label == "peak 1":
        first = f"The peak on {where} was {fmt_bytes(active)} active ({fmt_bytes(reserved)} reserved), {when}."
    else:
        first = (f"At {instant.label} on {where}, {fmt_bytes(active)} were active ({fmt_bytes(reserved)} "
                 f"reserved), {when}.")
    rows = category_rows(view, device, index)
    transient = [r for r in rows if r["category"] not in PERSISTENT and r["bytes"] > 0]
    persistent = [r for r in rows if r["category"] in PERSISTENT and r["bytes"] > 0]
    sentences = [first]
    named = [_category_phrase(r["category"], r["bytes"], r["inferred"]) for r in transient[:3]]
    if len(transient) > 3:
        rest = transient[3:]
        named.append(f"{len(rest)} more categor{'y' if len(rest) == 1 else 'ies'} "
                     f"({fmt_bytes(sum(r['bytes'] for r in rest))})")
    held = _join([_category_phrase(r["category"], r["bytes"], r["inferred"]) for r in persistent])
    if named and held:
        sentences.append(f"{_join(named)} were live on top of {held}.")
    elif named:
        sentences.append(f"{_join(named)} were live.")
    elif held:
        sentences.append(f"All live bytes were {held}.")
    baseline = dt.baseline_active
    if baseline and active >= baseline:
        sentences.append(f"{fmt_bytes(baseline)} were already live when the trace window began; "
                         f"{fmt_bytes(active - baseline)} rose within it.")
    if reserved > active:
        sentences.append(f"The allocator reserved {fmt_bytes(reserved - active)} more than was live "
                         "(cached free blocks and rounding).")
    return sentences


def _instant_anchor(view: RankView, device: int, index: int) -> str | None:
    """The anchor of the detail instant at `index` of `device`, if it is one."""
    for instant in view.details.get(device, []):
        if instant.event_index == index:
            return f"instant-{view.key(device)}-{instant.slug}"
    return None


def _phase_rows(view: RankView, device: int) -> tuple[list[dict[str, Any]], int]:
    """The phases table of one device (at most MAX_PHASE_ROWS, the largest transients) and how many were left."""
    table = view.phases
    rows = table[table["device"] == device] if len(table) else table
    if not len(rows):
        return [], 0
    shown = rows
    if len(rows) > MAX_PHASE_ROWS:
        shown = rows.sort_values(["transient_bytes", "start_index"], ascending=[False, True],
                                 kind="stable").head(MAX_PHASE_ROWS).sort_index()
    out = []
    for r in shown.itertuples(index=False):
        same_kind = rows[rows["kind"] == r.kind]
        events = (f"{int(r.start_index):,}–{int(r.end_index):,}" if int(r.end_index) >= int(r.start_index)
                  else "no events")
        out.append({"name": _phase_label(same_kind, r), "kind": r.kind, "events": events,
                    "before": int(r.before_bytes), "peak": int(r.peak_bytes), "transient": int(r.transient_bytes),
                    "after": int(r.after_bytes),
                    "categories": list(zip(r.top_categories, r.top_category_bytes, r.top_category_inferred_bytes)),
                    "flags": [f for f, on in (("clipped", r.clipped), ("open", r.open)) if on],
                    "anchor": _instant_anchor(view, device, int(r.peak_index))})
    return out, len(rows) - len(shown)


# -- the per-snapshot sections (repeated per rank of a run) --------------------------------------------------

# -- the verdict: a headline, a line per device, the program and its advice; the sentences folded below ----

VERDICT_FIRST = ("oom",)      # sections whose verdict sentences open the folded details (then ORDER's order)
INFERRED_NOTE = ("inferred: decided by sizes, lifetimes, layout, time, the call tree or a name rather than proven "
                 "by a frame, pool or metadata (Rules that fired gives the reason).")
_ENGINES: weakref.WeakKeyDictionary[RankView, Engine] = weakref.WeakKeyDictionary()


def engine_of(view: RankView) -> Engine:
    """The program of a view (`analyze.engine.detect_engine` over the blocks live at its verdict's instants:
    each device's main instant and its OOM entries), found once per view."""
    found = _ENGINES.get(view)
    if found is None:
        parts = []
        for device in view.devices:
            indices = [view.main(device).event_index] if view.details.get(device) else []
            if view.oom is not None:
                indices += [int(i) for i in view.oom.ooms.loc[view.oom.ooms["device"] == device, "index"]]
            for index in dict.fromkeys(indices):
                blocks = view.attribution(device, index).blocks
                parts.append(blocks.loc[blocks["device"] == device, ["stack_id", "category", "size"]])
        blocks = (pd.concat(parts, ignore_index=True) if parts
                  else pd.DataFrame({"stack_id": pd.Series(dtype="int64"), "category": [], "size": []}))
        found = _ENGINES[view] = detect_engine(view.snapshot, blocks)
    return found


def _flagged(row: dict[str, Any], owner: bool = False) -> str:
    """"9.56 GiB logits", with "(inferred)" or "(… inferred)" when frames did not prove it, and, where the
    category is `other` or inferred, the code that made most of it: "78.3 GiB other (78.1 GiB made in
    models.py:181:update_nodes)"."""
    text = f"{fmt_bytes(row['bytes'])} {row['category']}"
    notes = []
    if row["inferred"]:
        notes.append("inferred" if row["inferred"] >= row["bytes"] else f"{fmt_bytes(row['inferred'])} inferred")
    if owner and row.get("owner") and (row["category"] == "other" or row["inferred"]):
        share = "" if row["owner_bytes"] >= row["bytes"] else f"{fmt_bytes(row['owner_bytes'])} "
        notes.append(f"{share}made in {row['owner']}")
    return text + (f" ({'; '.join(notes)})" if notes else "")


def _held(rows: list[dict[str, Any]]) -> str:
    """"55.28 GiB of kv_cache and weights" (" (… inferred)" when some of it is)."""
    total, inferred = sum(r["bytes"] for r in rows), sum(r["inferred"] for r in rows)
    flag = "" if not inferred else " (inferred)" if inferred >= total else f" ({fmt_bytes(inferred)} inferred)"
    if len(rows) == 1:
        return _flagged(rows[0])
    return f"{fmt_bytes(total)} of {_join([r['category'] for r in rows])}{flag}"


@dataclass(frozen=True)
class _Live:
    """What was live at an instant, in a few words: `rose` ("9.56 GiB logits and 8.12 MiB workspace"; "" when
    only what stays was live), `held` ("61.84 GiB of kv_cache and weights"; "" when none of it was), the
    category that rose most (`owner`, None when none did) and whether an inferred amount was named."""

    rose: str
    held: str
    owner: str | None
    inferred: bool

    def text(self, verb: str = "") -> str:
        """"9.56 GiB logits{verb}, on top of 61.84 GiB of kv_cache and weights", "only …" or "nothing"."""
        if self.rose and self.held:
            return f"{self.rose}{verb}, on top of {self.held}" if verb else f"{self.rose} on top of {self.held}"
        if self.rose:
            return self.rose + verb
        return f"only {self.held}" if self.held else "nothing"


def _live(view: RankView, device: int, index: int, top: int = 1, rest: bool = True, owners: bool = False) -> _Live:
    """`_Live` at `index` of `device`: the `top` categories that rose (then, with `rest`, the others as
    "N more"), on top of the categories that stay (PERSISTENT); with `owners`, the code that made most of a
    category named `other` or inferred."""
    rows = [r for r in category_rows(view, device, index) if r["bytes"] > 0]
    transient = [r for r in rows if r["category"] not in PERSISTENT]
    persistent = [r for r in rows if r["category"] in PERSISTENT]
    named = transient if rest and len(transient) <= top + 1 else transient[:top]
    others = transient[len(named):] if rest else []
    parts = [_flagged(r, owners) for r in named]
    if others:
        parts.append(f"{len(others)} more categor{'y' if len(others) == 1 else 'ies'} "
                     f"({fmt_bytes(sum(r['bytes'] for r in others))})")
    return _Live(_join(parts), _held(persistent) if persistent else "",
                 str(named[0]["category"]) if named else None,
                 any(r["inferred"] for r in named + persistent))


def _at(view: RankView, device: int, index: int, short: bool = False) -> str:
    """"at 2.38 ms into the 2.41 ms window" ("at 2.38 ms" when `short`), "at event 598 of 619" without times."""
    dt = view.timeline[device]
    window, events = _window(view, device)
    t, first = dt.time_at(index), dt.time_at(0)
    if index < 0:
        return "at the start of the window"
    if window is None or t is None or first is None:
        return f"at event {index:,}" + ("" if short else f" of {events:,}")
    return f"at {fmt_duration_us(t - first)}" + ("" if short else f" into the {fmt_duration_us(window)} window")


def _during(view: RankView, device: int, index: int) -> str:
    phase = phase_at(view, device, index)
    return f", {phase}" if phase else ""


OOM_REASONS = {
    "fragmentation": lambda v: (f"no free block fits it although {fmt_bytes(v.reserved_free_bytes)} is reserved "
                                "but free"),
    "live_exhaustion": lambda v: f"{fmt_bytes(v.shortfall_bytes)} short of what the device could give",
    "outside_pressure": lambda v: (f"other processes held {fmt_bytes(v.pressure_bytes)}"
                                   if v.pressure == "other_processes" else
                                   f"memory outside the allocator grew by {fmt_bytes(v.pressure_bytes)}"),
    "unexplained": lambda v: (f"yet a {fmt_bytes(v.largest_free_block_bytes)} free block could have served it: "
                              "the state at the failure differs from the file"),
}


@dataclass(frozen=True)
class _Oom:
    view: RankView
    device: int
    verdict: Any                                  # analyze.oom.OomVerdict


def _ooms(report: Report) -> list[_Oom]:
    """Every OOM entry of the reported devices, in view and device order, earliest first."""
    found = []
    for view in report.views:
        if view.oom is None:
            continue
        verdicts = sorted((v for v in view.oom.verdicts if v.device in view.devices),
                          key=lambda v: (view.devices.index(v.device), v.index))
        found += [_Oom(view, v.device, v) for v in verdicts]
    return found


def _oom_headline(o: _Oom) -> tuple[str, bool]:
    v, view = o.verdict, o.view
    live = _live(view, o.device, v.index, rest=False)
    name = VERDICT_NAMES.get(v.verdict, v.verdict)
    reason = OOM_REASONS[v.verdict](v) if v.verdict in OOM_REASONS else ""
    return (f"{_capital(view.where(o.device))} ran out of memory {_at(view, o.device, v.index)}"
            f"{_during(view, o.device, v.index)}: a {fmt_bytes(v.request_bytes)} request failed ({name}"
            + (f": {reason}" if reason else "") + f"); live then: {live.text()}."), live.inferred


def _outlier(report: Report, view: RankView, device: int) -> Any | None:
    """The comparison row of (view's rank, device) when it is an outlier above the median rank."""
    comparison = report.run.comparison if report.run is not None else None
    if comparison is None or view.rank is None:
        return None
    t = comparison.table
    rows = t[(t["rank"] == view.rank.rank) & (t["device"] == device) & t["outlier"] & (t["difference_bytes"] > 0)]
    return rows.iloc[0] if len(rows) else None


def _peak_headline(report: Report, view: RankView, device: int) -> tuple[str, str | None, bool]:
    """The headline for the highest peak: how high, where, when, and the category that made the difference —
    against the median rank when the rank is an outlier, else on top of what stays."""
    index = view.main(device).event_index
    dt = view.timeline[device]
    active, reserved = dt.active_at(index), dt.reserved_at(index)
    when = _at(view, device, index) + _during(view, device, index)
    outlier = _outlier(report, view, device) if view.main(device).label == "peak 1" else None
    if outlier is not None and report.run is not None and report.run.comparison is not None:
        comparison = report.run.comparison
        diffs = comparison.differences
        mine = diffs[(diffs["rank"] == view.rank.rank) & (diffs["device"] == device)] if view.rank else diffs[:0]
        mine = mine.sort_values(["difference_bytes", "category"], ascending=[False, True], kind="stable")
        top = mine.iloc[0] if len(mine) and mine["difference_bytes"].iloc[0] > 0 else None
        text = (f"{_capital(view.where(device))} peaked highest, {fmt_bytes(int(outlier['difference_bytes']))} above "
                f"the median rank (rank {comparison.median_rank}): {fmt_bytes(active)} active "
                f"({fmt_bytes(reserved)} reserved) {when}")
        if top is not None:
            text += (f"; {top['category']} ({_signed(int(top['difference_bytes']))} against the median rank) made "
                     "the difference")
            return text + ".", str(top["category"]), False
        return text + ".", None, False
    live = _live(view, device, index, rest=False, owners=True)
    label = view.main(device).label
    first = (f"The peak on {view.where(device)} was {fmt_bytes(active)} active" if label == "peak 1" else
             f"At {label} on {view.where(device)}, {fmt_bytes(active)} were active")
    return (f"{first} ({fmt_bytes(reserved)} reserved) {when}: "
            f"{live.text(' made the difference' if live.owner else '')}."), live.owner, live.inferred


def _device_line(view: RankView, device: int, ooms: list[_Oom]) -> tuple[str, bool]:
    """One short line for a device: its OOM (if any), its peak and what rose on top of what stays."""
    head = _capital(view.where(device))
    parts = []
    for o in ooms:
        v = o.verdict
        parts.append(f"out of memory {_at(view, device, v.index, short=True)} "
                     f"({VERDICT_NAMES.get(v.verdict, v.verdict)}, a {fmt_bytes(v.request_bytes)} request)")
    inferred = False
    if view.details.get(device):
        instant = view.main(device)
        index = instant.event_index
        dt = view.timeline[device]
        live = _live(view, device, index, top=2)
        inferred = live.inferred
        label = "peak" if instant.label == "peak 1" else f"at {instant.label},"
        parts.append(f"{label} {fmt_bytes(dt.active_at(index))} active ({fmt_bytes(dt.reserved_at(index))} reserved) "
                     f"{_at(view, device, index, short=True)}{_during(view, device, index)}: {live.text()}")
    return f"{head}: " + "; ".join(parts) + ".", inferred


def _engine_line(engine: Engine) -> str:
    if engine.evidence is None:
        if not engine.framed:
            return ("Program: not recognised — the live blocks carry no frames; the advice is plain PyTorch's.")
        return "Program: plain PyTorch (no vLLM, SGLang, transformers or training frame in the live stacks)."
    if engine.blocks:
        share = (f"all {engine.framed:,}" if engine.blocks == engine.framed else
                 f"{engine.blocks:,} of the {engine.framed:,} ({fmt_share(engine.share)})")
        return (f"Program: {engine.label}, recognised by {engine.evidence} in the stacks of {share} live blocks "
                "with frames.")
    return f"Program: {engine.label}, recognised by {engine.evidence}."


def _refusals(view: RankView) -> list[str]:
    """"Rank 0: request req-3 was refused by an admission limit (…), not by the allocator." per device."""
    if view.oom is None:
        return []
    out = []
    for item in view.oom.no_oom:
        if not item.rejected_requests or item.device not in view.devices:
            continue
        names = _join([f"{r['name']}" + (f" ({r['reason']})" if r["reason"] else "") for r in item.rejected_requests])
        many = len(item.rejected_requests) > 1
        out.append(f"{_capital(view.where(item.device))}: request{'s' if many else ''} {names} "
                   f"{'were' if many else 'was'} refused by an admission limit, not by the allocator.")
    return out


def _warnings(view: RankView) -> list[str]:
    whose = "" if view.rank is None else f" of rank {view.rank.rank}"
    lines = []
    if view.snapshot.warnings:
        more = len(view.snapshot.warnings) - 1
        lines.append(f"Warning: the snapshot{whose} has inconsistencies the analysis worked around "
                     f"({view.snapshot.warnings[0]}" + (f", and {more} more" if more else "")
                     + "); see Snapshot facts.")
    problems = view.timeline.check_invariants()
    if problems:
        lines.append(f"Warning: the replay{whose} does not match the end state ({problems[0]}"
                     + (f", and {len(problems) - 1} more" if len(problems) > 1 else "") + "); see Snapshot facts.")
    return lines


def verdict_section(report: Report) -> Section | None:
    """The verdict at the top of the report, read in ten seconds: one headline sentence — the first OOM when
    an allocation failed (where, when, the request, why, what was live), else the highest peak (how much,
    where, when, the category that made the difference: against the median rank for a run's outlier) —
    then one short line per device of each rank (when there are several, or an OOM to set beside its peak),
    refusals and warnings, the program (`engine_of`) and what would help in its words (`oom_text`). Its
    `verdict` sentences — each device's peak in full, and once whether anything was live when the window
    began — are folded below with the other sections' (see `html.render_report`)."""
    ooms = _ooms(report)
    pairs = [(view, device) for view in report.views for device in view.devices]
    peaks = [(view, device) for view, device in pairs if view.details.get(device)]
    inferred = False
    if not pairs:
        headline = "The snapshot holds no devices: no segments and no trace."
        view, owner = report.views[0], None
    elif ooms:
        headline, inferred = _oom_headline(ooms[0])
        view, owner = ooms[0].view, None
    elif peaks:
        view, device = max(peaks, key=lambda p: p[0].timeline[p[1]].active_at(p[0].main(p[1]).event_index))
        headline, owner, inferred = _peak_headline(report, view, device)
    else:
        view, owner = pairs[0][0], None
        headline = f"Nothing was attributed on {_join([v.where(d) for v, d in pairs])}."
    lines: list[tuple[str, bool]] = []
    if len(pairs) > 1 or ooms:
        for v, device in pairs:
            text, flag = _device_line(v, device, [o for o in ooms if o.view is v and o.device == device])
            lines.append((text, False))
            inferred = inferred or flag
    lines += [(text, False) for v in report.views for text in _refusals(v)]
    lines += [(text, True) for v in report.views for text in _warnings(v)]
    engine = engine_of(view) if pairs else None
    advice: list[str] = []
    title = ""
    if engine is not None and ooms:
        advice, title = oom_text.advice(ooms[0].verdict, engine.name)[:2], "What would have helped"
    elif engine is not None and peaks:
        device_live = [r["category"] for v, d in peaks if v is view
                       for r in category_rows(v, d, v.main(d).event_index) if r["bytes"] > 0]
        advice, title = oom_text.peak_advice(owner, engine.name, device_live), "To lower the peak"
    details: list[str] = []
    for v, device in peaks:
        details += peak_sentences(v, v.main(device))
    empty = [v.where(d) for v, d in peaks if not v.timeline[d].baseline_active]
    if empty:
        details.append(f"Nothing was live when the trace window began on {_join(empty)}: the window holds every "
                       "allocation.")
    body = render("sections/verdict.html.j2", headline=headline,
                  lines=[{"text": t, "warning": w} for t, w in lines],
                  engine=_engine_line(engine) if engine is not None else None,
                  advice=advice, advice_title=title, note=INFERRED_NOTE if inferred else None)
    return Section(id="verdict", title="Verdict", body=body, verdict=tuple(details), order=ORDER["verdict"])


def timelines_section(report: Report) -> Section | None:
    """Active, reserved and allocated (estimate) bytes per device, peaks and OOM entries marked; for a rank of
    a run also NVML used, and the phases as bands with their table."""
    devices, figures = [], []
    for view in report.views:
        ooms = view.snapshot.ooms
        nvml = view.rank.nvml if view.rank is not None and len(view.rank.nvml) else None
        for device in view.devices:
            dt = view.timeline[device]
            axis = plots.time_axis(dt)
            fig_id = f"fig-timeline-{view.key(device)}"
            figures.append(FigureSpec(fig_id, plots.timeline_figure(
                view.timeline, device, view.peaks, ooms, nvml=nvml,
                phases=view.phases if len(view.phases) else None)))
            rows = []
            for r in view.peaks[view.peaks["device"] == device].itertuples():
                rows.append({"rank": int(r.rank), "when": axis.describe(dt, int(r.event_index)),
                             "active": int(r.active_bytes), "reserved": int(r.reserved_bytes),
                             "allocated_est": int(r.allocated_est_bytes), "transient": int(r.transient_bytes),
                             "held": None if pd.isna(r.duration_us) else int(r.duration_us),
                             "phase": phase_at(view, device, int(r.event_index))})
            window, events = _window(view, device)
            phases, more = _phase_rows(view, device)
            sampled = None
            if nvml is not None:
                t = plots.nvml_in_window(dt, nvml)["time_us"]
                inside = int(((t >= dt.time_at(0)) & (t <= dt.time_at(len(dt) - 1))).sum()) if len(t) else 0
                sampled = {"samples": inside, "interval_ms": view.rank.interval_ms if view.rank else None}
            devices.append({"device": device, "heading": view.heading(device), "figure": fig_id, "peaks": rows,
                            "events": events, "window": window, "downsampled": len(dt) > plots.TIMELINE_MAX_POINTS,
                            "baseline": dt.baseline_active, "phases": phases, "more_phases": more,
                            "nvml": sampled, "bands": bool(len(view.phases))})
    if not devices:
        return None
    body = render("sections/timelines.html.j2", devices=devices)
    return Section(id="timelines", title="Memory over time", body=body, figures=tuple(figures),
                   order=ORDER["timelines"])


def categories_section(report: Report) -> Section | None:
    """Live bytes per category at the instants where the live set changed most (and every peak and OOM),
    stacked as steps, with the exact active curve over them, per device."""
    devices, figures = [], []
    for view in report.views:
        series = view.series
        if not len(series):
            continue
        order = [name for name, _ in sorted(view.rules.categories.items(),
                                            key=lambda kv: (-kv[1].precedence, kv[0]))]
        for device in view.devices:
            part = series[series["device"] == device]
            if not len(part):
                continue
            marks = [(i.event_index, i.label) for i in view.details.get(device, [])]
            ooms = view.snapshot.ooms
            marks += [(int(i), "OOM") for i in ooms.loc[ooms["device"] == device, "index"]]
            fig_id = f"fig-categories-{view.key(device)}"
            figures.append(FigureSpec(fig_id, plots.categories_figure(series, view.timeline, device, order, marks)))
            devices.append({"device": device, "heading": view.heading(device), "figure": fig_id,
                            "instants": int(part["event_index"].nunique()), "events": len(view.timeline[device])})
    if not devices:
        return None
    body = render("sections/categories.html.j2", devices=devices)
    return Section(id="categories", title="Categories over time", body=body, figures=tuple(figures),
                   order=ORDER["categories"])


def _labeller(redact: Callable[[tuple[str, int, str]], tuple[str, int, str]]) -> plots.FrameLabel:
    """An icicle frame label that shows the frame redacted (when the report redacts)."""
    return lambda frame: plots.frame_label(redact(frame))


def segment_rows(view: RankView, device: int, index: int, fig_id: str) -> dict[str, Any] | None:
    """The segment map laid out at (device, index) (`RankView.segment_maps`): its figure (`spec`) and the
    numbers its template states, or None when none was laid out there."""
    smap = view.segment_maps.get((device, index))
    if smap is None or not len(smap.segments):
        return None
    free = smap.pieces[smap.pieces["state"] == "inactive"]
    largest = smap.largest_free
    figure = plots.segment_map_figure(smap)
    return {"spec": FigureSpec(fig_id, figure), "figure": fig_id, "height": int(figure.layout.height or 380),
            "segments": len(smap.segments), "reserved": smap.reserved_bytes,
            "free": smap.free_bytes, "free_pieces": len(free), "largest": largest.size if largest is not None else None,
            "largest_any": smap.largest_free_any_bytes, "request": smap.request_bytes,
            "pending": int(smap.segments["pending_free_bytes"].sum()), "exact": smap.exact, "source": smap.source,
            "shown": len({y for trace in figure.data for y in trace.y if not str(y).startswith("failed request")})}


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


def _oom_numbers(o: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of an OOM's numbers table, from one `explain_oom` row."""
    est = "" if o["exact"] else " (est.)"
    rows = [
        ("request (rounded)", o["request_bytes"], f"stream {o['stream']}, {o['segment_type']} pool"),
        ("free on the device", o["device_free_bytes"],
         "reported by the driver at the failure" if o["device_free_bytes"] is not None else "not recorded"),
        ("live (active)", o["active_bytes"], "Σ requested bytes of live blocks"),
        ("in blocks" + est, o["allocated_bytes"], "Σ sizes of blocks in use"),
        ("reserved", o["reserved_bytes"], "Σ segment sizes"),
        ("reserved but free" + est, o["reserved_free_bytes"], f"in {fmt_count(o['free_blocks'], 'free block')}"),
        ("largest usable free block" + est, o["largest_free_block_bytes"],
         f"same stream and pool; the largest of any: {fmt_bytes(o['largest_free_block_any_bytes'])}"),
        ("capacity", o["capacity_bytes"], o["capacity_source"] if o["capacity_bytes"] is not None else
         "unknown: no NVML samples or meta.json (report the run directory to know it)"),
        ("outside the allocator", o["outside_bytes"], o["outside_source"] or "unknown without the capacity"),
    ]
    if o["own_outside_bytes"] is not None or o["other_processes_bytes"] is not None:
        rows.append(("of it: this process (NVML)", o["own_outside_bytes"], "CUDA context, NCCL, libraries"))
        rows.append(("of it: other processes (NVML)", o["other_processes_bytes"], "listed by NVML on the device"))
    if o["shortfall_bytes"]:
        rows.append(("short by", o["shortfall_bytes"], "request − (reserved but free + free on the device)"))
    return [{"name": n, "bytes": None if v is None or v is pd.NA else int(v), "note": note} for n, v, note in rows]


def _plain_row(row: pd.Series) -> dict[str, Any]:
    return {k: (None if v is None or v is pd.NA or (isinstance(v, float) and v != v) else v) for k, v in row.items()}


def oom_section(report: Report) -> Section | None:
    """Why each allocation failed (`explain_oom`: fragmentation, live exhaustion or pressure from outside
    the allocator), with its numbers, what was live and what would have helped — or, for a rank whose
    request was refused although nothing failed, the statement that an admission limit refused it."""
    entries, refusals, verdict = [], [], []
    figures: list[FigureSpec] = []
    for view in report.views:
        if view.oom is None:
            continue
        for (_, row), oom in zip(view.oom.ooms.iterrows(), view.oom.verdicts):
            o = _plain_row(row)
            device, index = int(o["device"]), int(o["index"])
            why, advice = oom_text.why(oom), oom_text.advice(oom, engine_of(view).name)
            if device not in view.devices:
                continue
            when = when_in_window(view, device, index)
            phase = phase_at(view, device, index)
            when += f", {phase}" if phase else ""
            free = o["device_free_bytes"]
            segments = segment_rows(view, device, index, f"fig-segments-{view.key(device)}-oom-e{index}")
            if segments is not None:
                figures.append(segments["spec"])
            entries.append({
                "segments": segments,
                "device": device, "heading": view.heading(device), "when": when, "verdict": o["verdict"],
                "verdict_name": VERDICT_NAMES.get(o["verdict"], o["verdict"]), "why": _capital(why),
                "advice": advice, "numbers": _oom_numbers(o), "exact": bool(o["exact"]),
                "state_source": o["state_source"], "active": view.timeline[device].active_at(index),
                "rows": category_rows(view, device, index), "anchor": f"oom-{view.key(device)}-e{index}"})
            sentence = (f"{_capital(view.where(device))} ran out of memory {when}: a {fmt_bytes(o['request_bytes'])} "
                        "request failed" + (f" with {fmt_bytes(free)} free on the device" if free is not None else "")
                        + f". {_capital(why)}.")
            if advice:
                sentence += f" What would have helped: {advice[0]}."
            verdict.append(sentence)
        for item in view.oom.no_oom:
            if not item.rejected_requests or item.device not in view.devices:
                continue
            dt = view.timeline[item.device]
            origin = dt.time_at(0)
            rejected = [{"name": r["name"], "reason": r["reason"],
                         "when": (f"{fmt_duration_us(int(r['time_us']) - origin)} into the window"
                                  if origin is not None and int(r["time_us"]) >= origin else "before the window")}
                        for r in item.rejected_requests]
            said = oom_text.no_oom_message(item)
            refusals.append({"heading": view.heading(item.device), "message": _capital(said), "rejected": rejected})
            verdict.append(f"{_capital(view.where(item.device))}: {said}.")
    if not entries and not refusals:
        return None
    body = render("sections/oom.html.j2", entries=entries, refusals=refusals)
    return Section(id="oom", title="Out of memory", body=body, figures=tuple(figures), verdict=tuple(verdict),
                   order=ORDER["oom"])


def rules_section(report: Report) -> Section | None:
    """Which rule fired on which frame at each detail instant, and where the rules came from."""
    groups = []
    for view in report.views:
        label = view.redactor.label
        for device in view.devices:
            for n, instant in enumerate(view.details.get(device, [])):
                records = explain_records(view.attribution(device, instant.event_index), device)
                for record in records:
                    record["frame"] = label(record["frame"])
                groups.append({"device": device, "heading": view.heading(device), "label": instant.label,
                               "open": n == 0, "records": records})
    if not groups:
        return None
    sources = [report.redactor.path(s) if not s.startswith("rulepacks/") else s for s in report.rules.sources]
    body = render("sections/rules.html.j2", groups=groups, sources=sources)
    return Section(id="rules", title="Rules that fired", body=body, order=ORDER["rules"])


def facts_section(report: Report) -> Section | None:
    """What each file holds (format, inferred torch version, devices, allocator settings) and caveats; for a
    run also the ranks, their snapshots, NVML sampling and capacity, and what the run directory lacks."""
    parts = []
    for view in report.views:
        facts = summarize(view.snapshot)
        notes = sorted({note for device in view.devices for instant in view.details.get(device, [])
                        for note in view.attribution(device, instant.event_index).notes})
        if view.oom is not None:
            notes = sorted(set(notes) | set(view.oom.notes))
        settings = facts["allocator_settings"]
        shown = [(k, repr(v)) for k, v in sorted(settings.items())] if isinstance(settings, dict) else []
        source = view.redactor.path(view.snapshot.source)
        part = render("sections/facts.html.j2", facts=facts, source=source, settings=shown, notes=notes,
                      problems=view.timeline.check_invariants(), warnings=list(view.snapshot.warnings))
        if view.rank is not None:
            part = render("sections/rank_heading.html.j2", rank=view.rank.rank, tag=view.rank.tag) + part
        parts.append(part)
    run = None
    if report.run is not None:
        info = report.run
        ranks = []
        for view in report.views:
            assert view.rank is not None
            caps = [(d, *view.capacity(d)) for d in view.devices]
            ranks.append({"rank": view.rank.rank, "tag": view.rank.tag, "path": view.redactor.path(view.rank.path),
                          "nvml": len(view.rank.nvml), "interval_ms": view.rank.interval_ms,
                          "markers": len(view.rank.markers), "capacity": caps})
        run = {"path": report.source, "ranks": ranks, "all": list(info.ranks), "omitted": list(info.omitted),
               "world_size": info.samples.world_size, "problems": list(info.problems)}
    body = Markup("").join(parts)
    if run is not None:
        body = render("sections/run_facts.html.j2", run=run) + body
    title = "Snapshot facts" if report.run is None else "Run and snapshot facts"
    return Section(id="facts", title=title, body=body, order=ORDER["facts"])


# -- the run-level sections ---------------------------------------------------------------------------------

def ranks_section(report: Report) -> Section | None:
    """A run's ranks side by side at their peaks (`compare_ranks`): table, stacked categories per rank, and
    for each outlier the categories that differ from the median rank's."""
    if report.run is None or report.run.comparison is None or len(report.run.comparison.table) < 2:
        return None
    comparison = report.run.comparison
    table = comparison.table
    views = {view.rank.rank: view for view in report.views if view.rank is not None}
    multi = table["device"].nunique() > 1
    rows = []
    for r in table.itertuples(index=False):
        rank, device = int(r.rank), int(r.device)
        view = views.get(rank)
        at_peak = ({c["category"]: c["inferred"] for c in category_rows(view, device, int(r.event_index))}
                   if view is not None and device in view.devices else {})
        rows.append({
            "rank": rank, "device": device, "active": int(r.active_bytes), "reserved": int(r.reserved_bytes),
            "nvml_used": None if pd.isna(r.nvml_used_bytes) else int(r.nvml_used_bytes),
            "measured": bool(r.nvml_used_measured),
            "outside": None if pd.isna(r.outside_bytes) else int(r.outside_bytes),
            "top": r.top_category, "top_bytes": None if pd.isna(r.top_category_bytes) else int(r.top_category_bytes),
            "top_inferred": at_peak.get(r.top_category, 0),
            "difference": int(r.difference_bytes), "outlier": bool(r.outlier),
            "median": rank == comparison.median_rank and device == comparison.median_device,
            "phase": phase_at(view, device, int(r.event_index)) if view is not None else None,
            "anchor": _instant_anchor(view, device, int(r.event_index)) if view is not None else None})
    outliers, verdict = [], []
    diffs = comparison.differences
    for r in table[table["outlier"]].itertuples(index=False):
        rank, device = int(r.rank), int(r.device)
        mine = diffs[(diffs["rank"] == rank) & (diffs["device"] == device)]
        cats = [{"category": d.category, "bytes": int(d.bytes), "median": int(d.median_bytes),
                 "difference": int(d.difference_bytes), "share": float(d.share_of_difference)}
                for d in mine.itertuples(index=False)]
        name = f"rank {rank}" + (f", device {device}" if multi else "")
        side = "above" if r.difference_bytes > 0 else "below"
        outliers.append({"name": name, "difference": int(r.difference_bytes), "side": side, "categories": cats})
        view = views.get(rank)
        phase = phase_at(view, device, int(r.event_index)) if view is not None else None
        named = _join([f"{c['category']} {_signed(c['difference'])}" for c in cats[:4]]
                      + ([f"{len(cats) - 4} more"] if len(cats) > 4 else []))
        verdict.append(f"{_capital(name)} peaked {fmt_bytes(abs(int(r.difference_bytes)))} {side} the median rank "
                       f"(rank {comparison.median_rank}){', ' + phase if phase else ''}"
                       + (f": {named}." if named else "."))
    if not outliers:
        verdict.append(f"No rank stands out: every rank's peak lies within 2% (at least 256 MiB) of the median "
                       f"rank's (rank {comparison.median_rank}, {fmt_bytes(int(table['active_bytes'].median()))}).")
    order = [name for name, _ in sorted(report.rules.categories.items(), key=lambda kv: (-kv[1].precedence, kv[0]))]
    figure = FigureSpec("fig-ranks", plots.ranks_figure(table, comparison.categories, order))
    body = render("sections/ranks.html.j2", rows=rows, outliers=outliers, fig_id=figure.id, multi=multi,
                  median=comparison.median_rank, omitted=list(report.run.omitted))
    return Section(id="ranks", title="Ranks compared", body=body, figures=(figure,), verdict=tuple(verdict),
                   order=ORDER["ranks"])


def _outside_row(view: RankView, o: dict[str, Any]) -> dict[str, Any]:
    device = int(o["device"])
    dt = view.timeline[device]
    index = int(o["event_index"])
    capacity, capacity_source = view.capacity(device)
    used = o["nvml_used_bytes"]
    origin = dt.time_at(0)

    def offset(t: Any) -> str | None:
        if t is None or o["time_us"] is None:
            return None
        d = int(t) - int(o["time_us"])
        return f"{fmt_duration_us(abs(d))} {'before' if d < 0 else 'after'}" if d else "at the peak"

    return {
        "heading": view.heading(device), "peak": o["peak"], "anchor": _instant_anchor(view, device, index),
        "when": (f"{fmt_duration_us(int(o['time_us']) - origin)} into the window"
                 if o["time_us"] is not None and origin is not None else f"event {index:,}"),
        "phase": phase_at(view, device, index),
        "reserved": o["reserved_bytes"], "used": used, "measured": bool(o["nvml_used_measured"]),
        "outside": o["outside_bytes"], "low": o["outside_low_bytes"], "high": o["outside_high_bytes"],
        "own": o["own_outside_bytes"], "others": o["other_processes_bytes"], "basis": o["basis"],
        "samples": int(o["samples_during"] or 0), "before": offset(o["sample_before_us"]),
        "after": offset(o["sample_after_us"]), "interval": o["interval_us"], "held": o["duration_us"],
        "uncertain": bool(o["uncertain"]), "note": o["note"], "capacity": capacity,
        "capacity_source": capacity_source,
        "headroom": capacity - (used if used is not None else o["reserved_bytes"]) if capacity is not None else None}


def outside_section(report: Report) -> Section | None:
    """Memory outside the allocator (NVML used − reserved) at each peak of each rank with NVML samples: this
    process's part and other processes', the samples around the peak, and how uncertain the number is when
    the sampler was slower than the peak."""
    rows, missing, series = [], [], {}
    mains: list[str] = []
    others: list[str] = []
    origins = []
    for view in report.views:
        if view.rank is None:
            continue
        if view.outside is None:
            missing.append(view.rank.rank)
            continue
        for _, row in view.outside.iterrows():
            o = _plain_row(row)
            if int(o["device"]) not in view.devices:
                continue
            item = _outside_row(view, o)
            rows.append(item)
            if o["peak"] == 1 and item["outside"] is not None:
                where = view.where(int(o["device"]))
                if item["uncertain"]:
                    how = (f"an estimate: no NVML sample fell inside its {fmt_duration_us(item['held'])} peak"
                           if item["held"] is not None else "an estimate from the samples around it")
                    if item["interval"]:
                        how += f", sampled every {fmt_duration_us(int(item['interval']))}"
                else:
                    how = f"measured by {item['samples']} sample{'s' if item['samples'] != 1 else ''} during it"
                mains.append(f"{fmt_bytes(item['outside'])} on {where} ({how})")
                if item["others"]:
                    others.append(f"{fmt_bytes(item['others'])} on {where}")
        multi = len(view.joined) > 1
        for device, joined in view.joined.items():
            if len(joined):
                series[f"rank {view.rank.rank}" + (f" · device {device}" if multi else "")] = joined
                t = view.timeline[device].time_at(0)
                if t is not None:
                    origins.append(t)
    if not rows:
        return None
    verdict = []
    if mains:
        sentence = f"Memory outside the allocator at the peak (NVML used − reserved): {_join(mains)}."
        if others:
            sentence += f" Of that, other processes held {_join(others)}."
        verdict.append(sentence)
    figures: tuple[FigureSpec, ...] = ()
    if series and origins:
        figures = (FigureSpec("fig-outside", plots.outside_figure(series, min(origins))),)
    body = render("sections/outside.html.j2", rows=rows, missing=missing,
                  fig_id=figures[0].id if figures else None, what=WHAT_OUTSIDE)
    return Section(id="outside", title="Memory outside the allocator", body=body, figures=figures,
                   verdict=tuple(verdict), order=ORDER["outside"])


WHAT_OUTSIDE = ("NVML measures how much device memory lies outside the allocator — CUDA context, NCCL and "
                "library workspaces, other processes — not what it is.")


def diff_section(report: Report) -> Section | None:
    """This input against the baseline (`--compare`): aligned peaks, the categories and stacks that changed
    (`diff_document`), and bytes per category side by side."""
    if not report.diffs:
        return None
    views = {(view.rank.rank if view.rank is not None else None): view for view in report.views}
    parts, figures, verdict = [], [], []
    for item in report.diffs:
        view = views.get(item.rank, report.views[0])
        doc = diff_document(item.diff)
        label = view.redactor.label
        baseline = report.redactor.path(item.baseline)
        peaks = [{"device": p["device"], "phase": p["phase"], "a": p["a"]["active_bytes"], "b": p["b"]["active_bytes"],
                  "delta": p["delta"]} for p in doc["peaks"]]
        stacks = [{**s, "site": label(s["site"]), "frames": [label(f) for f in s["frames"]]}
                  for s in doc["stacks"][:MAX_DIFF_STACKS]]
        devices = []
        for device in sorted({p["device"] for p in doc["peaks"]}):
            fig_id = f"fig-diff-{view.key(device)}"
            figures.append(FigureSpec(fig_id, plots.compare_figure(item.diff.a, item.diff.b, device,
                                                                   labels=("baseline", "this input"))))
            devices.append({"device": device, "heading": view.heading(device), "figure": fig_id})
        parts.append({"rank": item.rank, "baseline": baseline, "instant": doc["instant"], "identical": doc["identical"],
                      "peaks": peaks, "categories": doc["categories"], "stacks": stacks, "counts": doc["counts"],
                      "more_stacks": max(0, len(doc["stacks"]) - MAX_DIFF_STACKS), "notes": doc["notes"],
                      "devices": devices})
        for p in doc["peaks"]:
            if p["scope"] != "global" or p["device"] not in view.devices:
                continue
            where = view.where(p["device"])
            delta = p["delta"]["active_bytes"]
            if doc["identical"]:
                verdict.append(f"Against the baseline {baseline}, the peak on {where} is unchanged: every category and "
                               "every stack holds the same bytes.")
                continue
            move = (f"rose by {fmt_bytes(delta)}" if delta > 0 else f"fell by {fmt_bytes(-delta)}" if delta < 0
                    else "kept its height")
            cats = [c for c in doc["categories"] if c["device"] == p["device"]]
            cats.sort(key=lambda c: (-abs(c["delta_bytes"]), c["category"]))
            named = _join([f"{c['category']} {_signed(c['delta_bytes'])}" for c in cats[:3]])
            counts = doc["counts"]
            moved = _join([f"{counts[k]} {k}" for k in ("new", "vanished", "grew", "shrank") if counts[k]])
            verdict.append(f"Against the baseline {baseline}, the peak on {where} {move} "
                           f"({fmt_bytes(p['a']['active_bytes'])} → {fmt_bytes(p['b']['active_bytes'])})"
                           + (f": {named}" if named else "") + (f"; stacks: {moved}" if moved else "") + ".")
    body = render("sections/diff.html.j2", parts=parts, problems=list(report.problems))
    return Section(id="diff", title="Compared with the baseline", body=body, figures=tuple(figures),
                   verdict=tuple(verdict), order=ORDER["diff"])


DEFAULT_SECTIONS: tuple[SectionFunction, ...] = (
    verdict_section, timelines_section, categories_section, instants_section, oom_section, ranks_section,
    outside_section, diff_section, rules_section, facts_section,
)
