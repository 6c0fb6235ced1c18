"""Report sections: each a function from a ReportContext to a Section (HTML fragment, figures, verdict lines).

Contract: a section function takes the `ReportContext` and returns a `Section`, or None when it has nothing
to say for this input (no OOM entries, no second rank, …) — the report never shows an empty placeholder.
A Section carries a stable `id` (its anchor, and the prefix of its figures' ids), a `title`, a `body` (HTML
rendered with `templating.render`, so every value is escaped), its `figures` (plotly Figures, each placed in
the body with the `figure` macro of `macros.html.j2` under its id), `verdict` sentences (plain text, shown at
the top of the report in section order) and an `order` (see ORDER). `DEFAULT_SECTIONS` is what
`snapanalyze report` shows, for one snapshot and for a run directory alike.

Runs: the per-snapshot sections (timelines, categories, instants, OOM, rules, facts) repeat their content
for each rank of `context.views()`, under "Rank r, device d" headings and with ids keyed by
`context.key(device)` ("d0" for a lone snapshot, "r1-d0" for rank 1), so a lone snapshot's report is the
same as before runs existed. The run-level sections read `context.run` (the per-rank comparison),
each view's `outside` (memory outside the allocator at its peaks) and `context.diffs` (against a baseline);
for a lone snapshot they return None.

Extension point: a later analysis plugs in by writing one more section function — reading its own inputs
from `context.inputs` (e.g. "path", the run directory) or computing from `context.snapshot` — and passing
`sections=(*DEFAULT_SECTIONS, its_section)` to `html.render_report` / `html.build_report` (or adding it to
DEFAULT_SECTIONS once it applies to every report). Its `order` places it (ORDER reserves slots: ranks 60,
outside 70, diff 80), and its `verdict` sentences join the verdict at the top. Nothing else changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from markupsafe import Markup

from .. import plots
from ..analyze.summary import summarize
from ..units import fmt_bytes, fmt_duration_us
from .compare_documents import diff_document
from .context import DetailInstant, ReportContext
from .documents import explain_records
from .templating import render

ORDER = {"verdict": 0, "timelines": 20, "categories": 30, "instants": 40, "oom": 50, "ranks": 60,
         "outside": 70, "diff": 80, "rules": 90, "facts": 100}
# Categories an engine holds for its whole life; the verdict names the others (what the step put on top).
PERSISTENT = ("weights", "kv_cache", "graph_capture")
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


SectionFunction = Callable[[ReportContext], "Section | None"]


# -- helpers ------------------------------------------------------------------------------------------------

def _join(parts: list[str]) -> str:
    if len(parts) <= 1:
        return "".join(parts)
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def _category_phrase(category: str, size: int, inferred: int) -> str:
    text = f"{fmt_bytes(size)} {category}"
    if category == "other":
        text += " (matched no rule)"
    if inferred and inferred >= size:
        text += " (inferred from tensor sizes)"
    elif inferred:
        text += f" ({fmt_bytes(inferred)} of it inferred from tensor sizes)"
    return text


def category_rows(context: ReportContext, device: int, event_index: int) -> list[dict[str, Any]]:
    """The attribution summary of one instant as template rows (top sites redacted when asked)."""
    attribution = context.attribution(device, event_index)
    summary = attribution.summary[attribution.summary["device"] == device]
    blocks = attribution.blocks[attribution.blocks["device"] == device]
    inferred = blocks[blocks["inferred"].astype(bool)].groupby("category")["size"].sum()
    label = context.redactor.label
    known = list(context.rules.categories)
    return [{"category": r.category, "bytes": int(r.bytes), "share": float(r.share), "blocks": int(r.blocks),
             "inferred": int(inferred.get(r.category, 0)), "color": plots.category_color(r.category, known),
             "sites": [(label(site), int(n)) for site, n in zip(r.top_frames, r.top_frame_bytes)]}
            for r in summary.itertuples()]


def _window(context: ReportContext, device: int) -> tuple[int | None, int]:
    """(window length in µs or None, number of events) of a device."""
    dt = context.timeline[device]
    first, last = dt.time_at(0), dt.time_at(len(dt) - 1)
    return ((last - first) if first is not None and last is not None else None), len(dt)


def when_in_window(context: ReportContext, device: int, index: int) -> str:
    """'at 2.38 ms into the 2.41 ms window (event 598 of 619)', or 'at event 598 of 619' without times."""
    dt = context.timeline[device]
    window, events = _window(context, device)
    event = "before the first event" if index < 0 else f"event {index:,} of {events:,}"
    t, first = dt.time_at(index), dt.time_at(0)
    if window is None or t is None or first is None:
        if index < 0:
            return "at the start of the window"
        return f"at {event}" + (" (the trace has no timestamps)" if window is None else "")
    return f"at {fmt_duration_us(t - first)} into the {fmt_duration_us(window)} window ({event})"


def peak_sentences(context: ReportContext, instant: DetailInstant) -> list[str]:
    """Plain sentences with numbers about one attributed instant: how high, when, and what held it."""
    device, index = instant.device, instant.event_index
    dt = context.timeline[device]
    active, reserved = dt.active_at(index), dt.reserved_at(index)
    when = when_in_window(context, device, index)
    if instant.label == "peak 1":
        first = (f"The peak on device {device} was {fmt_bytes(active)} active ({fmt_bytes(reserved)} reserved), "
                 f"{when}.")
    else:
        first = (f"At {instant.label} on device {device}, {fmt_bytes(active)} were active ({fmt_bytes(reserved)} "
                 f"reserved), {when}.")
    rows = category_rows(context, device, index)
    transient = [r for r in rows if r["category"] not in PERSISTENT and r["bytes"] > 0]
    persistent = [r for r in rows if r["category"] in PERSISTENT and r["bytes"] > 0]
    sentences = [first]
    named = [_category_phrase(r["category"], r["bytes"], r["inferred"]) for r in transient[:3]]
    if len(transient) > 3:
        rest = transient[3:]
        named.append(f"{len(rest)} more categor{'y' if len(rest) == 1 else 'ies'} "
                     f"({fmt_bytes(sum(r['bytes'] for r in rest))})")
    held = _join([f"{fmt_bytes(r['bytes'])} {r['category']}" for r in persistent])
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
    elif not baseline:
        sentences.append("Nothing was live when the trace window began: the window holds every allocation.")
    if reserved > active:
        sentences.append(f"The allocator reserved {fmt_bytes(reserved - active)} more than was live "
                         "(cached free blocks and rounding).")
    return sentences


# -- the sections -------------------------------------------------------------------------------------------

def verdict_section(context: ReportContext) -> Section | None:
    """The verdict's core: per device, the main instant in plain sentences (no body of its own)."""
    lines: list[str] = []
    for device in context.devices:
        if context.details.get(device):
            lines += peak_sentences(context, context.main(device))
    problems = context.timeline.check_invariants()
    if problems:
        lines.append(f"Warning: the replay does not match the end state ({problems[0]}"
                     + (f", and {len(problems) - 1} more" if len(problems) > 1 else "") + "); see Snapshot facts.")
    if not context.devices:
        lines.append("The snapshot holds no devices: no segments and no trace.")
    return Section(id="verdict", title="Verdict", verdict=tuple(lines), order=ORDER["verdict"])


def timelines_section(context: ReportContext) -> Section | None:
    """Active, reserved and allocated (estimate) bytes per device, peaks and OOM entries marked."""
    if not context.devices:
        return None
    devices, figures = [], []
    ooms = context.snapshot.ooms
    for device in context.devices:
        dt = context.timeline[device]
        axis = plots.time_axis(dt)
        fig_id = f"fig-timeline-d{device}"
        figures.append(FigureSpec(fig_id, plots.timeline_figure(context.timeline, device, context.peaks, ooms)))
        rows = []
        for r in context.peaks[context.peaks["device"] == device].itertuples():
            rows.append({"rank": int(r.rank), "when": axis.describe(dt, int(r.event_index)),
                         "active": int(r.active_bytes), "reserved": int(r.reserved_bytes),
                         "allocated_est": int(r.allocated_est_bytes), "transient": int(r.transient_bytes),
                         "held": None if pd.isna(r.duration_us) else int(r.duration_us)})
        window, events = _window(context, device)
        devices.append({"device": device, "figure": fig_id, "peaks": rows, "events": events, "window": window,
                        "downsampled": len(dt) > plots.TIMELINE_MAX_POINTS, "baseline": dt.baseline_active})
    body = render("sections/timelines.html.j2", devices=devices)
    return Section(id="timelines", title="Memory over time", body=body, figures=tuple(figures),
                   order=ORDER["timelines"])


def categories_section(context: ReportContext) -> Section | None:
    """Live bytes per category at sampled instants, stacked, per device."""
    series = context.series
    if not len(series):
        return None
    order = [name for name, _ in sorted(context.rules.categories.items(),
                                        key=lambda kv: (-kv[1].precedence, kv[0]))]
    devices, figures = [], []
    for device in context.devices:
        part = series[series["device"] == device]
        if not len(part):
            continue
        marks = [(i.event_index, i.label) for i in context.details.get(device, [])]
        ooms = context.snapshot.ooms
        marks += [(int(i), "OOM") for i in ooms.loc[ooms["device"] == device, "index"]]
        fig_id = f"fig-categories-d{device}"
        figures.append(FigureSpec(fig_id, plots.categories_figure(series, context.timeline, device, order, marks)))
        devices.append({"device": device, "figure": fig_id, "instants": int(part["event_index"].nunique())})
    body = render("sections/categories.html.j2", devices=devices)
    return Section(id="categories", title="Categories over time", body=body, figures=tuple(figures),
                   order=ORDER["categories"])


def instants_section(context: ReportContext) -> Section | None:
    """At each peak (or `--at` instant): what held the memory, as a table and an icicle of the live stacks."""
    instants, figures = [], []
    label = context.redactor.frame
    for device in context.devices:
        dt = context.timeline[device]
        axis = plots.time_axis(dt)
        for instant in context.details.get(device, []):
            attribution = context.attribution(device, instant.event_index)
            fig_id = f"fig-icicle-d{device}-{instant.slug}"
            figures.append(FigureSpec(fig_id, plots.icicle_figure(
                attribution, device, label=lambda frame: plots.frame_label(label(frame)))))
            instants.append({
                "device": device, "label": instant.label, "anchor": f"instant-d{device}-{instant.slug}",
                "when": axis.describe(dt, instant.event_index), "figure": fig_id,
                "active": dt.active_at(instant.event_index), "reserved": dt.reserved_at(instant.event_index),
                "baseline": dt.baseline_active, "request": attribution.instants[device].request,
                "rows": category_rows(context, device, instant.event_index)})
    if not instants:
        return None
    body = render("sections/instants.html.j2", instants=instants)
    return Section(id="instants", title="What held the memory", body=body, figures=tuple(figures),
                   order=ORDER["instants"])


def oom_section(context: ReportContext) -> Section | None:
    """The OOM entries of the trace: the request, what was free, and what was live when it failed."""
    ooms = context.snapshot.ooms
    ooms = ooms[ooms["device"].isin(context.devices)]
    if not len(ooms):
        return None
    entries, verdict = [], []
    for r in ooms.itertuples():
        device, index = int(r.device), int(r.index)
        dt = context.timeline[device]
        active, reserved, allocated = dt.active_at(index), dt.reserved_at(index), dt.allocated_est_at(index)
        free = None if pd.isna(r.device_free) else int(r.device_free)
        entry: dict[str, Any] = {
            "device": device, "index": index, "when": when_in_window(context, device, index), "size": int(r.size),
            "device_free": free, "active": active, "reserved": reserved, "allocated_est": allocated,
            "cached": reserved - allocated, "rows": category_rows(context, device, index)}
        entries.append(entry)
        sentence = (f"Device {device} ran out of memory {entry['when']}: a {fmt_bytes(int(r.size))} request "
                    "failed" + (f" with {fmt_bytes(free)} free on the device" if free is not None else "")
                    + f", while {fmt_bytes(active)} were live and {fmt_bytes(reserved)} reserved")
        sentence += (f" (about {fmt_bytes(reserved - allocated)} reserved but free)." if reserved > allocated else ".")
        verdict.append(sentence)
    body = render("sections/oom.html.j2", entries=entries)
    return Section(id="oom", title="Out-of-memory entries", body=body, verdict=tuple(verdict), order=ORDER["oom"])


def rules_section(context: ReportContext) -> Section | None:
    """Which rule fired on which frame at each detail instant, and where the rules came from."""
    groups = []
    label = context.redactor.label
    for device in context.devices:
        for n, instant in enumerate(context.details.get(device, [])):
            records = explain_records(context.attribution(device, instant.event_index), device)
            for record in records:
                record["frame"] = label(record["frame"])
            groups.append({"device": device, "label": instant.label, "open": n == 0, "records": records})
    if not groups:
        return None
    sources = [context.redactor.path(s) if not s.startswith("rulepacks/") else s for s in context.rules.sources]
    body = render("sections/rules.html.j2", groups=groups, sources=sources)
    return Section(id="rules", title="Rules that fired", body=body, order=ORDER["rules"])


def facts_section(context: ReportContext) -> Section | None:
    """What the file holds (format, inferred torch version, devices, allocator settings) and caveats."""
    facts = summarize(context.snapshot)
    notes = sorted({note for device in context.devices for instant in context.details.get(device, [])
                    for note in context.attribution(device, instant.event_index).notes})
    settings = facts["allocator_settings"]
    shown = [(k, repr(v)) for k, v in sorted(settings.items())] if isinstance(settings, dict) else []
    body = render("sections/facts.html.j2", facts=facts, source=context.source, settings=shown, notes=notes,
                  problems=context.timeline.check_invariants())
    return Section(id="facts", title="Snapshot facts", body=body, order=ORDER["facts"])


DEFAULT_SECTIONS: tuple[SectionFunction, ...] = (
    verdict_section, timelines_section, categories_section, instants_section, oom_section, rules_section,
    facts_section,
)
