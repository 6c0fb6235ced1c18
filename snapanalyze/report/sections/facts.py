"""Snapshot facts: what each file holds (format, inferred torch version, devices, allocator settings), its
notes, warnings and replay problems; for a run also the ranks, their snapshots, NVML sampling and capacity,
and what the run directory lacks."""

from __future__ import annotations

from markupsafe import Markup

from ...analyze.summary import summarize
from ..context import Report
from ..templating import render
from .section import ORDER, Section


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
        settings = facts.allocator_settings
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
