"""`snapanalyze report`: one self-contained HTML postmortem of a snapshot (or one rank of a run directory).

The command loads, builds the report (`report.html.build_report`) and writes it atomically: into a
temporary file beside the target, then renamed over it, so a reader never sees half a report. It refuses to
replace an existing file without --force. Progress goes to stderr only on a terminal (`progress`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import click

from ..analyze.rules import load_rules
from ..errors import UsageError
from ..load import load
from ..report.html import build_report
from . import main
from .common import input_argument
from .progress import Progress


def write_atomic(path: Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` through a temporary file in the same directory and a rename."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@main.command()
@input_argument
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The HTML file to write.")
@click.option("--force", is_flag=True, help="Replace the output file if it exists.")
@click.option("--redact-paths", is_flag=True,
              help="Show file paths as package-relative tails or hashes, for sharing outside the team.")
@click.option("--at", "at", multiple=True,
              help="Attribute in detail at this instant instead of the top peaks: peak, peak:N, event:I, "
                   "time:T (µs since the epoch). Repeat for several.")
@click.option("--top", default=3, show_default=True, type=click.IntRange(1),
              help="Peaks per device to mark (and, without --at, to attribute in detail).")
@click.option("--samples", default=32, show_default=True, type=click.IntRange(2, 1000),
              help="Instants per device attributed for the categories-over-time chart.")
@click.option("--device", type=int, default=None, help="Only this device.")
@click.option("--rules", "rules_file", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="A TOML file of your own categories and rules, layered over the shipped packs.")
def report(file: str, rank: int | None, tag: str | None, output: Path, force: bool, redact_paths: bool,
           at: tuple[str, ...], top: int, samples: int, device: int | None, rules_file: str | None) -> None:
    """Write one HTML postmortem that opens offline in any browser."""
    if output.exists() and not force:
        raise UsageError(f"{output}: exists already; pass --force to replace it")
    if not output.parent.is_dir():
        raise UsageError(f"{output}: the directory {output.parent} does not exist")
    rules = load_rules(rules_file)
    progress = Progress()
    try:
        progress.step("loading")
        snapshot = load(file, rank, tag)
        page = build_report(snapshot, rules=rules, top=top, at=at, samples=samples, device=device,
                            redact_paths=redact_paths, inputs={"path": file, "rank": rank, "tag": tag},
                            progress=progress.step)
        progress.step("writing")
        write_atomic(output, page)
    finally:
        progress.done()
    size = output.stat().st_size
    click.echo(f"wrote {output} ({size / 1e6:.2f} MB)")
