"""The verdict at the top of the report, read in ten seconds: a headline (the first OOM, else the highest
peak and the category that made the difference), one short line per device, refusals and warnings, the
program that ran and what would help in its words; the full sentences about each device's peak are folded
below it with the other sections' verdict sentences."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...analyze.engine import Engine
from ...units import fmt_bytes, fmt_share
from .. import oom_text
from ..context import DetailInstant, RankView, Report
from ..redact import Redactor
from ..templating import render
from .phrases import (
    INFERRED_NOTE,
    OOM_REASONS,
    VERDICT_NAMES,
    _at,
    _capital,
    _category_phrase,
    _during,
    _join,
    _live,
    _signed,
    phase_at,
    when_in_window,
)
from .section import ORDER, Section
from .view import category_rows


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
    transient = [r for r in rows if r["category"] not in view.rules.persistent and r["bytes"] > 0]
    persistent = [r for r in rows if r["category"] in view.rules.persistent and r["bytes"] > 0]
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
    stack = v.failed.stack if v.failed is not None else None
    who = view.redactor.site(stack.owner or stack.frame) if stack is not None else ""
    return (f"{_capital(view.where(o.device))} ran out of memory {_at(view, o.device, v.index)}"
            f"{_during(view, o.device, v.index)}: a {fmt_bytes(v.request_bytes)} request"
            + (f" from {who}" if who else "") + f" failed ({name}"
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
    if len(dt) <= 1:                          # a state without a trace (or a 1-entry legacy one): no peak, no time
        return (f"The file holds the allocator's state but no trace: {fmt_bytes(active)} live on "
                f"{view.where(device)} ({fmt_bytes(reserved)} reserved): {live.text()}; when it peaked and whether "
                "an allocation failed cannot be seen without a trace."), None, live.inferred
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


def _headroom(pairs: list[tuple[RankView, int]]) -> str:
    """The least headroom among the devices whose capacity is known (given, NVML or meta.json): what it left
    above the highest reserved bytes of the window, with or without an OOM ("" where no capacity is known)."""
    found = []
    for view, device in pairs:
        capacity, source = view.capacity(device)
        if capacity is not None:
            dt = view.timeline[device]
            highest = int(max(np.max(dt.reserved, initial=0), dt.baseline_reserved))
            found.append((capacity - highest, highest, capacity, source, view, device))
    if not found:
        return ""
    left, highest, capacity, source, view, device = min(found, key=lambda f: f[0])
    where = f" (the least, on {view.where(device)})" if len(found) > 1 else ""
    if left < 0:      # measured on a larger device, or the capacity given is not this device's
        return (f"Headroom{where}: the highest reserved, {fmt_bytes(highest)}, is more than the "
                f"{fmt_bytes(capacity)} device holds, by {fmt_bytes(-left)}: on it this run would fail "
                f"(capacity: {source}).")
    return (f"Headroom{where}: the highest reserved, {fmt_bytes(highest)}, left {fmt_bytes(left)} of headroom on "
            f"the {fmt_bytes(capacity)} device, not counting memory outside the allocator (capacity: {source}).")


def _engine_line(engine: Engine, redactor: Redactor) -> str:
    evidence = engine.evidence_text(redactor.site_path)
    if evidence is None:
        if not engine.framed:
            return ("Program: not recognised — the live blocks carry no frames; the advice is plain PyTorch's.")
        return "Program: plain PyTorch (no vLLM, SGLang, transformers or training frame in the live stacks)."
    if engine.blocks:
        share = (f"all {engine.framed:,}" if engine.blocks == engine.framed else
                 f"{engine.blocks:,} of the {engine.framed:,} ({fmt_share(engine.share)})")
        return (f"Program: {engine.label}, recognised by {evidence} in the stacks of {share} live blocks "
                "with frames.")
    return f"Program: {engine.label}, recognised by {evidence}."


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
    refusals and warnings, the program (`RankView.engine`) and what would help in its words (`oom_text`). Its
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
    if headroom := _headroom(pairs):
        lines.append((headroom, False))
    lines += [(text, False) for v in report.views for text in _refusals(v)]
    lines += [(text, True) for v in report.views for text in _warnings(v)]
    engine = view.engine if pairs else None
    advice: list[str] = []
    title = ""
    if engine is not None and ooms:
        advice = oom_text.advice(ooms[0].verdict, engine.name, ooms[0].view.redactor.site_path)[:2]
        title = "What would have helped"
    elif engine is not None and [p for p in peaks if len(p[0].timeline[p[1]]) > 1]:   # a state alone has no peak
        device_live: dict[str, int] = {}
        for v, d in peaks:
            if v is view:
                for r in category_rows(v, d, v.main(d).event_index):
                    device_live[r["category"]] = device_live.get(r["category"], 0) + int(r["bytes"])
        kept = [v.kept[d] for v, d in peaks if v is view and d in v.kept]
        advice = [oom_text.kept_words(k, "at the peak", view.redactor.site_path) for k in kept[:1]]
        advice += oom_text.peak_advice(owner, engine.name, device_live, sum(device_live.values()))
        title = "To lower the peak"
    details: list[str] = []
    for v, device in peaks:
        details += peak_sentences(v, v.main(device))
    empty = [v.where(d) for v, d in peaks if not v.timeline[d].baseline_active]
    if empty:
        details.append(f"Nothing was live when the trace window began on {_join(empty)}: the window holds every "
                       "allocation.")
    body = render("sections/verdict.html.j2", headline=headline,
                  lines=[{"text": t, "warning": w} for t, w in lines],
                  engine=_engine_line(engine, view.redactor) if engine is not None else None,
                  advice=advice, advice_title=title, note=INFERRED_NOTE if inferred else None)
    return Section(id="verdict", title="Verdict", body=body, verdict=tuple(details), order=ORDER["verdict"])
