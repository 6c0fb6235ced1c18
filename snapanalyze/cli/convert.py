"""`snapanalyze convert`: snapshot pickles (a run directory, an engine's dump directory, or files) → a Parquet run
directory; which file goes where, and what may be replaced, is `session.convert.convert_plan`'s, and each file's
work (its tables and the categories at its peaks) `session.convert_file`'s, on --jobs/--scheduler workers when
there are several; a file that fails is named once the others are converted (exit 2)."""

from __future__ import annotations

import functools
from pathlib import Path

import click

from .. import layout
from ..errors import SnapanalyzeError
from ..parallel import map_ranks
from ..session.convert import convert_plan
from ..session.runs import Converted, convert_file
from . import main
from .common import rules_for, rules_option
from .parallel import executor, parallel_options
from .progress import Progress


@main.command()
@click.argument("inputs", nargs=-1, required=True, type=click.Path(dir_okay=True, path_type=str))
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Run directory to write (default: convert a run directory in place).")
@click.option("--rank", type=int, default=None, help="Rank of a single input file (default: from a rank=N "
              "parent directory, else from an engine's file name, else 0).")
@click.option("--tag", default=None, help="Tag of a single input file: 1-128 letters, digits, '.', '_' or '-' "
              "(default: from snapshot-<tag>.pickle or an engine's file name, else the file name made safe).")
@click.option("--force", is_flag=True, help="Replace converted tables that already exist (never anything else).")
@rules_option(f"A TOML file of your own categories and rules, for the categories at each peak ({layout.PEAK_TABLE}).")
@parallel_options
def convert(inputs: tuple[str, ...], output: str | None, rank: int | None, tag: str | None, force: bool,
            rules_file: str | None) -> None:
    """Turn snapshot pickles into a Parquet run directory (RUN/rank=N/tag=T/*.parquet), each with the categories
    at its devices' peaks (peak_categories.parquet) for SQL over the run."""
    jobs = convert_plan(inputs, output, rank, tag, force)
    work = functools.partial(convert_file, force=force, rules=rules_for(rules_file))
    if len(jobs) == 1:                                   # one file: its error as it is
        with Progress() as progress:
            progress.step(f"converting {jobs[0][0]}")
            done = work(jobs[0])
        click.echo(_line(*jobs[0], done))
        return
    failed = []
    with Progress() as progress:
        for (source, target), outcome in zip(jobs, map_ranks(work, jobs, executor(), progress.step, unit="files")):
            if outcome.result is None:
                failed.append(outcome)
                continue
            progress.done()                              # the line below replaces it; the next step draws again
            click.echo(_line(source, target, outcome.result))
    if failed:
        error = SnapanalyzeError(f"{len(failed)} of {len(jobs)} not converted: " +
                                 "; ".join(str(o.error) for o in failed))
        error.exit_code = failed[0].exit_code
        raise error


def _line(source: Path, target: Path, done: Converted) -> str:
    from ..report.text import one_line
    return one_line(f"{source} → {target}") + f" ({done.events:,} events, {done.stacks:,} stacks, {done.seconds:.2f} s)"
