"""Commands that compare snapshots or runs: diff, capacity, check — `diff` and `check` rank by rank over
multi-rank runs (per-rank work: `_diff`, `_check`, see `per_rank`)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import click

from ..analyze.capacity import DEFAULT_CONCURRENCY, DRIVER_ORDER, capacity_contract, fit_capacity
from ..analyze.capacity_result import capacity_result
from ..analyze.check import parse_limits
from ..errors import UsageError
from ..report.budget_documents import budget_document
from ..report.budget_terminal import render_engine_check
from ..report.compare_terminal import render_capacity, render_check, render_diff
from ..session import measure_sweep_inputs
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
from .parallel import executor, parallel_options
from .per_rank import Job, Step, diff_plan, each, emit, plan, run_document
from .progress import Progress

if TYPE_CHECKING:
    from ..analyze.check_result import CheckReport
    from ..analyze.diff_result import DiffResult

_RANK = click.option("--rank", type=int, default=None, help="Rank in run directories.")
_TAG = click.option("--tag", default=None, help="Snapshot tag in run directories (default: final).")


@main.command()
@click.argument("a", type=click.Path(dir_okay=True, path_type=str))
@click.argument("b", type=click.Path(dir_okay=True, path_type=str))
@_RANK
@_TAG
@click.option("--phase", default=None, help="Compare at the peak of this phase in each, named as `phases` prints "
              "it (NAME, or NAME#K), instead of the global peak; only that phase's peaks are listed.")
@device_option()
@rules_option()
@click.option("--top", default=15, show_default=True, type=click.IntRange(1), help="Stacks shown in the table.")
@click.option("--all", "everything", is_flag=True, help="Also list unchanged categories and stacks (json).")
@format_option()
@source_option
@parallel_options
def diff(a: str, b: str, rank: int | None, tag: str | None, phase: str | None, device: int | None,
         rules_file: str | None, source: tuple[str, ...], top: int, everything: bool, fmt: str) -> None:
    """What changed between A and B at the peak: aligned peaks, categories, stacks (new, vanished, grown).

    Two run directories are compared rank by rank (a snapshot file, or a run of one rank, serves every rank
    of the other); --rank compares one."""
    rules_for(rules_file)                              # a bad --rules or --source fails before any load
    index = source_for(source)
    p = diff_plan(a, b, rank, tag)
    work = functools.partial(_diff, phase=phase, device=device, rules_file=rules_file, source=index,
                             everything=everything)
    with Progress() as progress:
        p, results = each(p, work, progress)
    if fmt == "json" and p.multi:
        doc = run_document(p, results)
        emit_json({"a": a, "b": b, "ranks": doc["ranks"], "problems": doc["problems"]})
        p.finish()
        return
    emit(p, results, fmt, lambda r, width: render_diff(r, top, width))


def _diff(job: Job, step: Step, phase: str | None, device: int | None, rules_file: str | None,
          source: Any, everything: bool) -> DiffResult:
    from ..analyze.diff import diff as diff_snapshots
    from ..analyze.diff_result import diff_result
    from ..session.inputs import open_input

    a, b = job.inputs
    step("loading A")
    input_a = open_input(a.path, a.rank, a.tag, frames="allocations", source=source)
    markers_a = input_a.markers
    step("loading B")
    input_b = open_input(b.path, b.rank, b.tag, frames="allocations", source=source)
    markers_b = input_b.markers
    step("replaying and attributing both")
    result = diff_snapshots(input_a.snapshot, input_b.snapshot, phase=phase, device=device,
                            rules=rules_for(rules_file), markers=(markers_a, markers_b))
    return diff_result(result, everything=everything)


@main.command()
@click.argument("inputs", nargs=-1, type=click.Path(dir_okay=True, path_type=str))
@click.option("--shape-from", "shape_from", default="filename", show_default=True,
              help="Where each point's shape comes from: filename (ctx1024, tokens=32768, bs4, chunk=2048, "
                   "images=8), markers (phase attrs in a run's markers.parquet, or record_function span names), "
                   "or a manifest .csv mapping file → tokens/batch/chunk/images (no INPUTS: every file it lists).")
@click.option("--budget", type=SIZE, default=None, help="Device budget for the contract, e.g. 80GiB.")
@click.option("--transient-budget", "transient_budget", type=SIZE, default=None,
              help="Budget for the transient alone (e.g. the workspace an engine leaves free).")
@click.option("--margin", type=click.FloatRange(0), default=None,
              help="Fraction added to modelled transients (default: the total fit's max relative residual).")
@click.option("--target", type=float, default=None,
              help="Driver value to size the workspace reserve for (default: the largest measured; at most 2× it: "
                   "fits are not trusted further).")
@click.option("--concurrency", type=click.IntRange(1), multiple=True,
              help="Concurrency levels for the contract (repeatable; default "
                   f"{', '.join(map(str, DEFAULT_CONCURRENCY))}).")
@click.option("--driver", type=click.Choice(DRIVER_ORDER), default=None,
              help="Shape variable to fit against (default: the one that explains the transient best).")
@device_option("Device to measure (default: the one with the highest peak).")
@_RANK
@_TAG
@rules_option()
@format_option()
@source_option
@parallel_options
def capacity(inputs: tuple[str, ...], shape_from: str, budget: int | None, transient_budget: int | None,
             margin: float | None, target: float | None, concurrency: tuple[int, ...], driver: str | None,
             device: int | None, rank: int | None, tag: str | None, rules_file: str | None,
             source: tuple[str, ...], fmt: str) -> None:
    """Fit a shape sweep (baseline / peak / transient per shape and category), find jumps, solve a budget.

    Answers past the largest measured shape are labelled extrapolated and stop at 2× it (bound); a regime
    with fewer than 3 shapes is insufficient data, not a number."""
    rules, index = rules_for(rules_file), source_for(source)
    if budget is None and transient_budget is None and (margin is not None or target is not None or concurrency):
        raise UsageError("capacity: --margin, --target and --concurrency shape the contract; give --budget or "
                         "--transient-budget too")
    with Progress() as progress:
        sweep = measure_sweep_inputs(list(inputs), shape_from, rank, tag, rules, device, executor(), progress.step,
                                     source=index)
        cap = fit_capacity(sweep, driver)
    contract = None
    if budget is not None or transient_budget is not None:
        contract = capacity_contract(cap, budget, transient_budget, margin, concurrency or DEFAULT_CONCURRENCY, target)
    result = capacity_result(cap, contract)
    if fmt == "json":
        emit_json(result.to_json())
        return
    width = terminal_width()
    echo_text(render_capacity(result, width), width)


def _sized(ctx: click.Context, param: click.Parameter, items: tuple[str, ...]) -> tuple[str, ...]:
    """--max CATEGORY=SIZE: each SIZE read as --budget's is (a unit is needed), before any file is read."""
    for item in items:
        name, sep, size = item.partition("=")
        if sep and name.strip():
            SIZE.convert(size, param, ctx)
    return items


@main.command()
@input_argument
@click.option("--budget", type=SIZE, default=None, help="Maximum peak bytes on a device, e.g. 70GiB.")
@click.option("--max", "maxima", multiple=True, metavar="CATEGORY=SIZE", callback=_sized,
              help="Maximum live bytes of one category anywhere in the trace (repeatable), e.g. logits=4GiB.")
@click.option("--max-transient", "max_transient", type=SIZE, default=None,
              help="Maximum transient: the peak over the active bytes at the window start, or with --phase the "
                   "phase's peak over its start (what `phases` shows).")
@click.option("--phase", default=None, help="Measure --max-transient over this phase (a name `phases` lists).")
@click.option("--metric", type=click.Choice(["active", "reserved"]), default="active", show_default=True,
              help="What --budget limits: peak active (requested) bytes or the highest reserved bytes.")
@click.option("--engine-log", "engine_log", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="A serving engine's start-up log (vLLM, SGLang): fail when the measured peak exceeds the "
                   "engine's own budget or the device (see `budget`).")
@click.option("--total", type=SIZE, default=None, help="The device's memory, for --engine-log when the log does "
              "not state it (vLLM V1).")
@device_option()
@rules_option()
@format_option()
@source_option
@parallel_options
def check(file: str, rank: int | None, tag: str | None, budget: int | None, maxima: tuple[str, ...],
          max_transient: int | None, phase: str | None, metric: str, engine_log: str | None, total: int | None,
          device: int | None, rules_file: str | None, source: tuple[str, ...], fmt: str) -> None:
    """Exit 1 when the snapshot exceeds a budget, a category maximum, a transient maximum or the serving
    engine's memory budget (for CI).

    Each limit's result is one line on stdout (FAIL … > limit, or ok); a run directory is checked rank by rank
    and fails when any rank exceeds a limit, naming the rank."""
    limits = parse_limits(maxima)
    if budget is None and not limits and max_transient is None and engine_log is None:
        raise UsageError("check: give at least one limit (--budget, --max category=size, --max-transient, "
                         "--engine-log)")
    if phase is not None and max_transient is None:
        raise UsageError("check: --phase says what --max-transient is measured over; give --max-transient too")
    if total is not None and engine_log is None:
        raise UsageError("check: --total completes an --engine-log; give --engine-log too")
    rules_for(rules_file)                              # a bad --rules or --source fails before any load
    index = source_for(source)
    engine = None
    if engine_log is not None:
        from .budget import budget_of_input

        engine = budget_of_input(file, engine_log, total, rank, tag, rules_file, device, index)
        if fmt != "json":
            echo_text(render_engine_check(engine), terminal_width())
        if budget is None and not limits and max_transient is None:    # the engine's budget is the only limit
            if fmt == "json":
                emit_json({"source": file, "engine_log": engine_log, "passed": not engine.exceeds,
                           "budget": budget_document(engine)})
            if engine.exceeds:
                click.get_current_context().exit(1)
            return
    p = plan(file, rank, tag)
    work = functools.partial(_check, budget=budget, limits=limits, max_transient=max_transient, metric=metric,
                             device=device, rules_file=rules_file, source=index, phase=phase)
    with Progress() as progress:
        p, results = each(p, work, progress)
    limits_held = all(r.passed for r in results)
    passed = limits_held and (engine is None or not engine.exceeds)
    if fmt == "json":
        doc = results[0].to_json()
        if p.multi:
            run = run_document(p, results)
            doc = {"run": run["run"], "metric": metric, "passed": limits_held,
                   "ranks": run["ranks"],
                   "failures": [f"rank {j.rank}: {f}" for j, r in zip(p.jobs, results) for f in r.failures],
                   "problems": run["problems"]}
        if engine is not None:
            doc = {**doc, "passed": passed, "engine_budget": budget_document(engine)}
        emit_json(doc)
    else:
        ranks = [j.rank if p.multi else None for j in p.jobs]
        echo_text(render_check(list(zip(ranks, results)), p.path if p.multi else results[0].source,
                               None if engine is None else not engine.exceeds, p.problems if p.multi else ()),
                  terminal_width())
    p.finish()
    if not passed:
        click.get_current_context().exit(1)


def _check(job: Job, step: Step, budget: int | None, limits: dict[str, int], max_transient: int | None,
           metric: str, device: int | None, rules_file: str | None, source: Any,
           phase: str | None = None) -> CheckReport:
    from ..analyze.check import check as check_limits
    from ..analyze.check_result import check_report
    from ..session.inputs import open_input

    t = job.target
    step("loading")
    given = open_input(t.path, t.rank, t.tag, frames="allocations", source=source)
    step("replaying and measuring" + (" (attributing every category)" if limits else ""))
    result = check_limits(given.snapshot, budget=budget, max_category=limits, max_transient=max_transient,
                          metric=metric, rules=rules_for(rules_file), device=device, phase=phase,
                          markers=given.markers if phase is not None else None)
    return check_report(result)
