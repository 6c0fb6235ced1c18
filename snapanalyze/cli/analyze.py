"""Commands that analyse snapshots: summary, peaks, attribute — of one snapshot, or of each rank of a run.

Each command is a thin shell around a per-rank work function (`_summary`, `_peaks`, `_attribute`: a job
and a progress callback → a small JSON-ready result, see `per_rank`), merged in rank order.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import click

from ..errors import UsageError
from . import main
from .common import (
    device_option,
    format_option,
    input_argument,
    rules_for,
    rules_option,
    source_for,
    source_option,
)
from .parallel import parallel_options
from .per_rank import Job, Step, each, emit, plan
from .progress import Progress

if TYPE_CHECKING:
    from ..analyze.attribute.compact import AttributionResult
    from ..analyze.peaks import Peaks
    from ..analyze.summary import Summary

AT_HELP = ("Instant per device: peak, peak:N (Nth peak), event:I, time:T — T as the outputs print it "
           "(2026-04-18 02:34:01.223438 UTC, or ISO 2026-04-18T02:34:01.223438Z), an offset into the trace "
           "window (+2.38ms, +1.5s, +120us) or µs since the epoch.")


# -- peaks ----------------------------------------------------------------------------------------------------

def _peaks(job: Job, step: Step, top: int, device: int | None) -> Peaks:
    from ..analyze.peaks import peaks_of
    from ..replay import replay
    from ..session.inputs import open_input

    t = job.target
    step("loading")
    snapshot = open_input(t.path, t.rank, t.tag, frames=False).snapshot       # peaks never reads a stack
    step("replaying")
    timeline = replay(snapshot)
    if device is not None and device not in timeline.devices:
        raise UsageError(f"{snapshot.source}: no device {device} (devices: {sorted(timeline.devices)})")
    host = replay(snapshot.host) if snapshot.host is not None and device is None else None
    step("finding peaks")
    return peaks_of(timeline, top, device, host)                              # no DataFrame: fast start


@main.command()
@input_argument
@click.option("--top", default=5, show_default=True, type=click.IntRange(1), help="Peaks per device.")
@device_option()
@format_option()
@parallel_options
def peaks(file: str, rank: int | None, tag: str | None, top: int, device: int | None, fmt: str) -> None:
    """Baseline, top peaks and trace window of each device (of each rank of a run directory)."""
    from ..report.terminal import render_peaks

    p = plan(file, rank, tag)
    with Progress() as progress:
        p, results = each(p, functools.partial(_peaks, top=top, device=device), progress)
    emit(p, results, fmt, render_peaks)


# -- summary --------------------------------------------------------------------------------------------------

def _summary(job: Job, step: Step) -> Summary:
    from ..analyze.summary import summarize
    from ..session.inputs import open_input

    t = job.target
    step("loading")
    snapshot = open_input(t.path, t.rank, t.tag).snapshot
    step("summarising")
    return summarize(snapshot)


@main.command()
@input_argument
@format_option()
@parallel_options
def summary(file: str, rank: int | None, tag: str | None, fmt: str) -> None:
    """What the file holds: format, torch version (inferred), devices, events, optional parts (per rank of a run)."""
    from ..report.terminal import render_summary

    p = plan(file, rank, tag)
    with Progress() as progress:
        p, results = each(p, _summary, progress)
    emit(p, results, fmt, lambda r, width: render_summary(r))


# -- attribute ------------------------------------------------------------------------------------------------

def _attribute(job: Job, step: Step, at: str, phase: str | None, device: int | None, rules_file: str | None,
               source: Any, explain: bool, csv: bool, rank_column: bool,
               top: int = 3) -> AttributionResult | dict[str, str]:
    from ..session.inputs import open_input

    t = job.target
    rules = rules_for(rules_file)
    step("loading")
    given = open_input(t.path, t.rank, t.tag, frames="allocations", source=source)  # only the stacks attribution reads
    snapshot = given.snapshot
    from ..analyze.attribute import BLOCK_COLUMNS
    from ..analyze.attribute import attribute as attribute_blocks  # pandas after the raw objects are freed
    from ..analyze.attribute.compact import attribution_result
    from ..analyze.phases import attribute_phase
    from ..report.blocks_csv import blocks_csv

    markers = given.markers
    step("attributing")
    if phase is not None:
        result = attribute_phase(snapshot, phase, markers=markers, rules=rules, device=device)
    else:
        result = attribute_blocks(snapshot, at=at, rules=rules, device=device, markers=markers)
    if csv:
        blocks = result.blocks[BLOCK_COLUMNS]        # what the table shows, not the ids it is made from
        if rank_column:
            blocks = blocks.assign(rank=job.rank)[["rank", *blocks.columns]]
        return {"csv": blocks_csv(blocks)}
    return attribution_result(result, explain=explain, top=top)


@main.command()
@input_argument
@click.option("--at", "at", default="peak", show_default=True, help=AT_HELP)
@click.option("--phase", default=None,
              help="Attribute the peak inside this phase, named as `phases` prints it: NAME, or NAME#K for its "
                   "K-th occurrence (a marker, record_function or user_metadata span) instead of --at.")
@device_option()
@rules_option()
@click.option("--top", default=3, show_default=True, type=click.IntRange(1), help="Sites shown per category.")
@format_option(click.Choice(["table", "json", "csv"]),
               "csv prints one row per live block (a run: with a rank column).")
@click.option("--explain", is_flag=True, help="Show which rule fired on which frame.")
@source_option
@parallel_options
def attribute(file: str, rank: int | None, tag: str | None, at: str, phase: str | None, device: int | None,
              rules_file: str | None, source: tuple[str, ...], top: int, fmt: str, explain: bool) -> None:
    """Attribute every live byte at a peak (or another instant) to a category (per rank of a run)."""
    from ..report.terminal import render_attribution

    rules_for(rules_file)                              # a bad --rules or --source fails before any load
    index = source_for(source)
    if phase is not None and at != "peak":
        raise UsageError("--phase and --at choose the instant two ways: give one of them")
    p = plan(file, rank, tag)
    work = functools.partial(_attribute, at=at, phase=phase, device=device, rules_file=rules_file, source=index,
                             explain=explain, csv=fmt == "csv", rank_column=p.multi, top=top)
    with Progress() as progress:
        p, results = each(p, work, progress)
    if fmt == "csv":
        texts = [r["csv"] for r in results if isinstance(r, dict)]
        click.echo(texts[0] + "".join(t.partition("\n")[2] for t in texts[1:]), nl=False)
        p.finish()
        return
    typed = [r for r in results if not isinstance(r, dict)]      # without --format csv: every one
    emit(p, typed, fmt, lambda r, width: render_attribution(r, top, explain, width))
