"""Commands that analyse one snapshot: summary, peaks, attribute."""

from __future__ import annotations

import click

from ..analyze.peaks import peak_records
from ..errors import UsageError
from ..load import load
from ..replay import replay
from ..report.documents import attribution_document, peaks_document
from ..report.terminal import render_attribution, render_peaks, render_summary
from . import main
from .common import FORMATS, emit_json, input_argument, rules_for, source_option


@main.command()
@input_argument
@click.option("--top", default=5, show_default=True, type=click.IntRange(1), help="Peaks per device.")
@click.option("--device", type=int, default=None, help="Only this device.")
@click.option("--format", "fmt", type=FORMATS, default="table", show_default=True)
def peaks(file: str, rank: int | None, tag: str | None, top: int, device: int | None, fmt: str) -> None:
    """Baseline, top peaks and trace window of each device."""
    snapshot = load(file, rank, tag)
    timeline = replay(snapshot)
    if device is not None and device not in timeline.devices:
        raise UsageError(f"{file}: no device {device} (devices: {sorted(timeline.devices)})")
    host = replay(snapshot.host) if snapshot.host is not None and device is None else None
    doc = peaks_document(timeline, peak_records(timeline, top=top, device=device),  # no DataFrame: fast start
                         (host, peak_records(host, top=top)) if host is not None else None)
    if fmt == "json":
        emit_json(doc)
        return
    click.echo(render_peaks(doc, timeline.check_invariants()))


@main.command()
@input_argument
@click.option("--format", "fmt", type=FORMATS, default="table", show_default=True)
def summary(file: str, rank: int | None, tag: str | None, fmt: str) -> None:
    """What the file holds: format, torch version (inferred), devices, events, optional parts."""
    from ..analyze.summary import summarize
    facts = summarize(load(file, rank, tag))
    if fmt == "json":
        emit_json(facts)
        return
    click.echo(render_summary(facts))


@main.command()
@input_argument
@click.option("--at", "at", default="peak", show_default=True,
              help="Instant per device: peak, peak:N (Nth peak), event:I, time:T (µs since the epoch).")
@click.option("--phase", default=None,
              help="Attribute the peak inside this phase (a marker, record_function or user_metadata span; NAME#K "
                   "for its K-th occurrence) instead of --at.")
@click.option("--device", type=int, default=None, help="Only this device.")
@click.option("--rules", "rules_file", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="A TOML file of your own categories and rules, layered over the shipped packs.")
@click.option("--top", default=3, show_default=True, type=click.IntRange(1), help="Sites shown per category.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table",
              show_default=True, help="csv prints one row per live block.")
@click.option("--explain", is_flag=True, help="Show which rule fired on which frame.")
@source_option
def attribute(file: str, rank: int | None, tag: str | None, at: str, phase: str | None, device: int | None,
              rules_file: str | None, source: tuple[str, ...], top: int, fmt: str, explain: bool) -> None:
    """Attribute every live byte at a peak (or another instant) to a category."""
    from ..analyze.attribute import attribute as attribute_blocks
    from ..analyze.phases import attribute_phase
    from ..load.samples import markers_for

    rules = rules_for(rules_file, source)
    if phase is not None:
        if at != "peak":
            raise UsageError("--phase and --at choose the instant two ways: give one of them")
        result = attribute_phase(load(file, rank, tag), phase, markers=markers_for(file, rank, tag), rules=rules,
                                 device=device)
    else:
        result = attribute_blocks(load(file, rank, tag), at=at, rules=rules, device=device,
                                  markers=markers_for(file, rank, tag))
    if fmt == "csv":
        click.echo(result.blocks.to_csv(index=False), nl=False)
        return
    doc = attribution_document(result, explain=explain)
    if fmt == "json":
        emit_json(doc)
        return
    click.echo(render_attribution(doc, top, explain))
