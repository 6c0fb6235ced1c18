"""Commands over a run directory's ranks and events: ranks, explain-oom, phases (per rank: `_phases`)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import click

from .. import layout
from . import main
from .common import (
    SIZE,
    device_option,
    echo_text,
    emit_json,
    format_option,
    input_argument,
    rules_for,
    rules_option,
    source_for,
    source_option,
    terminal_width,
)
from .parallel import executor, parallel_options, start_early
from .per_rank import Job, Step, each, emit, plan
from .progress import Progress

if TYPE_CHECKING:
    from ..analyze.phase_result import Phases


@main.command()
@click.argument("run", type=click.Path(exists=True, file_okay=False, path_type=str))
@click.option("--tag", default=None, help="Snapshot tag to compare (default: final, else a rank's only snapshot).")
@rules_option()
@click.option("--threshold", default=0.02, show_default=True, type=click.FloatRange(0),
              help="An outlier's peak differs from the median rank's by more than this fraction (and 256 MiB).")
@format_option()
@source_option
@parallel_options
def ranks(run: str, tag: str | None, rules_file: str | None,
          source: tuple[str, ...], threshold: float, fmt: str) -> None:
    """One row per rank at its peak: NVML used, memory outside the allocator, top category; the outliers."""
    rules, index = rules_for(rules_file), source_for(source)
    start_early(len(layout.rank_dirs(run)))
    from ..analyze.rank_result import ranks_of
    from ..report.run_terminal import render_ranks
    from ..session import compare_ranks, open_run

    with Progress() as progress:
        opened = open_run(run, progress.step, frames="allocations", source=index)
        comparison = compare_ranks(opened, tag=tag, rules=rules, threshold=threshold, executor=executor(),
                                   progress=progress.step)
    result = ranks_of(comparison)
    if fmt == "json":
        emit_json(result.to_json())
        return
    width = terminal_width()
    echo_text(render_ranks(result, width), width)


@main.command("explain-oom")
@input_argument
@click.option("--capacity", type=SIZE, default=None,
              help="Device memory (e.g. 40GiB) when the file has no NVML/meta.json.")
@rules_option()
@format_option()
@source_option
def explain_oom(file: str, rank: int | None, tag: str | None, capacity: int | None, rules_file: str | None,
                source: tuple[str, ...],
                fmt: str) -> None:
    """Why each allocation failed (fragmentation, live exhaustion, pressure from outside) — or that none did."""
    from ..report.run_documents import oom_document
    from ..report.run_terminal import render_oom
    from ..session import explain_path

    rules, index = rules_for(rules_file), source_for(source)
    with Progress() as progress:
        progress.step("explaining")
        items, problems = explain_path(file, rank=rank, tag=tag, rules=rules, capacity=capacity, source=index)
    if fmt == "json":
        emit_json(oom_document(items, problems, file))
        return
    width = terminal_width()
    echo_text(render_oom(items, problems, file, width), width)


@main.command()
@input_argument
@device_option()
@rules_option()
@click.option("--no-categories", is_flag=True, help="Skip attributing each phase's peak (faster).")
@click.option("--kind", "kinds", multiple=True, type=click.Choice(["phase", "request", "annotation", "metadata"]),
              help="Only spans of this kind (repeat for several): collector phases or requests, record_function "
                   "annotations, user_metadata values.")
@click.option("--largest", type=click.IntRange(1), default=None,
              help="Only the N spans with the largest transient per device (a serving run marks thousands of "
                   "requests).")
@format_option()
@source_option
@parallel_options
def phases(file: str, rank: int | None, tag: str | None, device: int | None, rules_file: str | None,
           source: tuple[str, ...],
           no_categories: bool, kinds: tuple[str, ...], largest: int | None, fmt: str) -> None:
    """Before / peak / after of each phase (collector markers, record_function annotations, user_metadata), per
    rank of a run. The phase column is each phase's name as --phase accepts it (NAME, or NAME#K when repeated)."""
    from ..report.run_terminal import render_phases

    rules_for(rules_file)                              # a bad --rules or --source fails before any load
    index = source_for(source)
    p = plan(file, rank, tag)
    work = functools.partial(_phases, device=device, rules_file=rules_file, source=index,
                             categories=not no_categories, kinds=kinds or None, largest=largest)
    with Progress() as progress:
        p, results = each(p, work, progress)
    emit(p, results, fmt, render_phases)


def _phases(job: Job, step: Step, device: int | None, rules_file: str | None, source: Any,
            categories: bool, kinds: tuple[str, ...] | None, largest: int | None) -> Phases:
    from ..analyze.phase_result import phases_of
    from ..analyze.phases import phase_table
    from ..replay import replay
    from ..session.inputs import open_input

    t = job.target
    step("loading")
    given = open_input(t.path, t.rank, t.tag, frames="allocations", source=source)
    snapshot, markers = given.snapshot, given.markers
    step("replaying")
    timeline = replay(snapshot)
    step("mapping phases" + (" and attributing their peaks" if categories else ""))
    table = phase_table(snapshot, timeline, markers=markers, rules=rules_for(rules_file),
                        categories=categories, device=device, kinds=kinds, largest=largest)
    return phases_of(table, snapshot.source)
