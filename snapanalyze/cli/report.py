"""`snapanalyze report`: one self-contained HTML postmortem of a snapshot, or of every rank of a run directory.

The command builds the report (`report.html.build_path_report`: a snapshot file, or a run directory with
per-rank timelines, NVML used, phases, the rank comparison, memory outside the allocator and the OOM
explanation; `--rank N` reports one rank; `--compare BASELINE` adds the diff against a baseline, as
`snapanalyze diff BASELINE FILE` computes it) and writes it atomically: into a temporary file beside the
target, then renamed over it, so a reader never sees half a report. It refuses to replace an existing file
without --force. Progress goes to stderr only on a terminal (`progress`).
"""

from __future__ import annotations

from pathlib import Path

import click

from .. import layout
from ..atomic import write_atomic
from ..errors import UsageError
from ..report.text import one_line
from . import main
from .common import (
    SIZE,
    device_option,
    input_argument,
    rules_for,
    rules_option,
    source_for,
    source_option,
)
from .parallel import executor, parallel_options, start_early
from .progress import Progress


@main.command()
@input_argument
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The HTML file to write.")
@click.option("--force", is_flag=True, help="Replace the output file if it exists.")
@click.option("--redact-paths", is_flag=True,
              help="Show file paths as package-relative tails or hashes, for sharing outside the team.")
@click.option("--at", "at", multiple=True,
              help="Attribute in detail at this instant instead of the top peaks: peak, peak:N, event:I, "
                   "time:T (T: a UTC date-time as printed, ISO 8601, an offset into the window such as +2.38ms, "
                   "or µs since the epoch). Repeat for several.")
@click.option("--top", default=3, show_default=True, type=click.IntRange(1),
              help="Peaks per device to mark (and, without --at, to attribute in detail).")
@click.option("--samples", default=32, show_default=True, type=click.IntRange(2, 1000),
              help="Instants per device attributed for the categories-over-time chart.")
@device_option()
@rules_option()
@click.option("--compare", "baseline", type=click.Path(exists=True, dir_okay=True, path_type=str), default=None,
              metavar="BASELINE",
              help="Add a section diffing this input against BASELINE (a snapshot or run; Δ = FILE − BASELINE, "
                   "as `snapanalyze diff BASELINE FILE`), rank by rank for two runs.")
@click.option("--capacity", type=SIZE, default=None,
              help="Device memory (e.g. 80GiB) for OOM verdicts and headroom, when the input has no NVML/meta.json.")
@click.option("--engine-log", "engine_log", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="A serving engine's start-up log (vLLM, SGLang): add its budget beside what each snapshot "
                   "measured (as `snapanalyze budget`; --capacity gives the device total the log may not).")
@source_option
@parallel_options
def report(file: str, rank: int | None, tag: str | None, output: Path, force: bool, redact_paths: bool,
           at: tuple[str, ...], top: int, samples: int, device: int | None, rules_file: str | None,
           source: tuple[str, ...],
           baseline: str | None, capacity: int | None, engine_log: str | None) -> None:
    """Write one HTML postmortem that opens offline in any browser.

    FILE is a snapshot, or a run directory: then every rank is reported (--rank N: only that one) with its
    NVML samples, phases, the comparison across ranks and memory outside the allocator."""
    if output.exists() and not force:
        raise UsageError(f"{output}: exists already; pass --force to replace it")
    if not output.parent.is_dir():
        raise UsageError(f"{output}: the directory {output.parent} does not exist")
    rules, index = rules_for(rules_file), source_for(source)
    budget = None
    if engine_log is not None:
        from .budget import budget_of_input

        budget = budget_of_input(file, engine_log, capacity, rank, tag, rules_file, device, index)
    if rank is None:
        start_early(len(layout.rank_dirs(file)))      # a run: its workers start while plotly and jinja2 import
    progress = Progress()
    try:
        from ..report.html import build_path_report  # plotly and jinja2 load only for this command

        page = build_path_report(file, rank=rank, tag=tag, compare=baseline, rules=rules, top=top, at=at,
                                 samples=samples, device=device, redact_paths=redact_paths, progress=progress.step,
                                 capacity=capacity, executor=executor(), source=index, budget=budget)
        progress.step("writing")
        write_atomic(output, lambda f: f.write(page.encode("utf-8")))
    finally:
        progress.done()
    size = output.stat().st_size
    click.echo(f"wrote {one_line(str(output))} ({size / 1e6:.2f} MB)")
