"""`snapanalyze convert`: snapshot pickles (a run directory, an engine's dump directory, or files) → a Parquet run
directory; which file goes where, and what may be replaced, is `load.convert.convert_plan`'s."""

from __future__ import annotations

import time

import click

from ..load import load
from ..load.convert import convert_plan
from ..load.parquet import write_tables
from . import main


@main.command()
@click.argument("inputs", nargs=-1, required=True, type=click.Path(dir_okay=True, path_type=str))
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Run directory to write (default: convert a run directory in place).")
@click.option("--rank", type=int, default=None, help="Rank of a single input file (default: from a rank=N "
              "parent directory, else from an engine's file name, else 0).")
@click.option("--tag", default=None, help="Tag of a single input file: 1-128 letters, digits, '.', '_' or '-' "
              "(default: from snapshot-<tag>.pickle or an engine's file name, else the file name made safe).")
@click.option("--force", is_flag=True, help="Replace converted tables that already exist (never anything else).")
def convert(inputs: tuple[str, ...], output: str | None, rank: int | None, tag: str | None, force: bool) -> None:
    """Turn snapshot pickles into a Parquet run directory (RUN/rank=N/tag=T/*.parquet)."""
    jobs = convert_plan(inputs, output, rank, tag, force)
    for source, target in jobs:
        started = time.perf_counter()
        snapshot = load(source)
        write_tables(snapshot, target, force=force)
        n = sum(len(t) for t in snapshot.traces.values())
        click.echo(f"{source} → {target} ({n:,} events, {len(snapshot.interner.stacks):,} stacks, "
                   f"{time.perf_counter() - started:.2f} s)")
