"""Commands that compare snapshots or runs: diff, capacity, check."""

from __future__ import annotations

import click

from ..analyze.capacity import DEFAULT_CONCURRENCY, DRIVER_ORDER, capacity_contract, fit_capacity
from ..analyze.check import BudgetExceeded, parse_limits
from ..analyze.check import check as check_limits
from ..analyze.diff import diff as diff_snapshots
from ..analyze.sweep import measure_sweep
from ..errors import UsageError
from ..load import load
from ..report.compare_documents import capacity_document, check_document, diff_document
from ..report.compare_terminal import render_capacity, render_check, render_diff
from ..session import sweep_points
from . import main
from .common import FORMATS, SIZE, emit_json, input_argument, rules_for, source_option

_RULES = click.option("--rules", "rules_file", type=click.Path(dir_okay=False, path_type=str), default=None,
                      help="A TOML file of your own categories and rules, layered over the shipped packs.")
_RANK = click.option("--rank", type=int, default=None, help="Rank in run directories.")
_TAG = click.option("--tag", default=None, help="Snapshot tag in run directories (default: final).")


@main.command()
@click.argument("a", type=click.Path(dir_okay=True, path_type=str))
@click.argument("b", type=click.Path(dir_okay=True, path_type=str))
@_RANK
@_TAG
@click.option("--phase", default=None, help="Compare at the peak of this phase (a record_function span) in each, "
              "instead of the global peak.")
@click.option("--device", type=int, default=None, help="Only this device.")
@_RULES
@click.option("--top", default=15, show_default=True, type=click.IntRange(1), help="Stacks shown in the table.")
@click.option("--all", "everything", is_flag=True, help="Also list unchanged categories and stacks (json).")
@click.option("--format", "fmt", type=FORMATS, default="table", show_default=True)
@source_option
def diff(a: str, b: str, rank: int | None, tag: str | None, phase: str | None, device: int | None,
         rules_file: str | None, source: tuple[str, ...], top: int, everything: bool, fmt: str) -> None:
    """What changed between A and B at the peak: aligned peaks, categories, stacks (new, vanished, grown)."""
    rules = rules_for(rules_file, source)
    result = diff_snapshots(load(a, rank, tag), load(b, rank, tag), phase=phase, device=device, rules=rules)
    doc = diff_document(result, everything=everything)
    if fmt == "json":
        emit_json(doc)
        return
    click.echo(render_diff(doc, top))


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
              help="Driver value to size the workspace reserve for (default: the largest measured).")
@click.option("--concurrency", type=click.IntRange(1), multiple=True,
              help="Concurrency levels for the contract (repeatable; default "
                   f"{', '.join(map(str, DEFAULT_CONCURRENCY))}).")
@click.option("--driver", type=click.Choice(DRIVER_ORDER), default=None,
              help="Shape variable to fit against (default: the one that explains the transient best).")
@click.option("--device", type=int, default=None, help="Device to measure (default: the one with the highest peak).")
@_RANK
@_TAG
@_RULES
@click.option("--format", "fmt", type=FORMATS, default="table", show_default=True)
@source_option
def capacity(inputs: tuple[str, ...], shape_from: str, budget: int | None, transient_budget: int | None,
             margin: float | None, target: float | None, concurrency: tuple[int, ...], driver: str | None,
             device: int | None, rank: int | None, tag: str | None, rules_file: str | None,
             source: tuple[str, ...], fmt: str) -> None:
    """Fit a shape sweep (baseline / peak / transient per shape and category), find jumps, solve a budget."""
    rules = rules_for(rules_file, source)
    points = sweep_points(list(inputs), shape_from, rank, tag)
    cap = fit_capacity(measure_sweep(points, rules, device), driver)
    contract = None
    if budget is not None or transient_budget is not None:
        contract = capacity_contract(cap, budget, transient_budget, margin, concurrency or DEFAULT_CONCURRENCY, target)
    elif margin is not None or target is not None or concurrency:
        raise UsageError("capacity: --margin, --target and --concurrency shape the contract; give --budget or "
                         "--transient-budget too")
    doc = capacity_document(cap, contract)
    if fmt == "json":
        emit_json(doc)
        return
    click.echo(render_capacity(doc))


@main.command()
@input_argument
@click.option("--budget", type=SIZE, default=None, help="Maximum peak bytes on a device, e.g. 70GiB.")
@click.option("--max", "maxima", multiple=True, metavar="CATEGORY=SIZE",
              help="Maximum live bytes of one category anywhere in the trace (repeatable), e.g. logits=4GiB.")
@click.option("--max-transient", "max_transient", type=SIZE, default=None,
              help="Maximum transient at the peak (peak − baseline active bytes).")
@click.option("--metric", type=click.Choice(["active", "reserved"]), default="active", show_default=True,
              help="What --budget limits: peak active (requested) bytes or the highest reserved bytes.")
@click.option("--device", type=int, default=None, help="Only this device.")
@_RULES
@click.option("--format", "fmt", type=FORMATS, default="table", show_default=True)
@source_option
def check(file: str, rank: int | None, tag: str | None, budget: int | None, maxima: tuple[str, ...],
          max_transient: int | None, metric: str, device: int | None, rules_file: str | None,
          source: tuple[str, ...], fmt: str) -> None:
    """Exit 1 when the snapshot exceeds a budget, a category maximum or a transient maximum (for CI)."""
    rules = rules_for(rules_file, source)
    limits = parse_limits(maxima)
    result = check_limits(load(file, rank, tag), budget=budget, max_category=limits, max_transient=max_transient,
                          metric=metric, rules=rules, device=device)
    doc = check_document(result)
    if fmt == "json":
        emit_json(doc)
    else:
        click.echo(render_check(doc))
    if not result.passed:
        raise BudgetExceeded("; ".join(doc["failures"]))
