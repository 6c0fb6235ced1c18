"""Command line: argv → library calls → text or JSON on stdout, exit codes. Nothing else lives here.

Contract: each command is thin (load, analyse, render); one place (`_Group.invoke`) maps SnapanalyzeError to
a one-line message on stderr and exit code 2 (`--debug` shows the traceback instead). Output formats:
`table` for people, `json` for scripts.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click

__version__ = "0.1.0"
from .analyze.attribute import attribute as attribute_blocks
from .analyze.peaks import find_peaks
from .analyze.rules import load_rules
from .analyze.summary import summarize
from .errors import SnapanalyzeError, UsageError
from .load import load
from .load.convert import convert_plan
from .load.parquet import write_tables
from .replay import replay
from .report import text
from .report.documents import attribution_document, peaks_document

FORMATS = click.Choice(["table", "json"])


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SnapanalyzeError as exc:
            if (ctx.obj or {}).get("debug"):
                raise
            click.echo(f"snapanalyze: error: {exc}", err=True)
            ctx.exit(exc.exit_code)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show a traceback on errors.")
@click.version_option(__version__, prog_name="snapanalyze")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """Explain GPU memory peaks from PyTorch allocator snapshots."""
    ctx.obj = {"debug": debug}


def _input(func: Any) -> Any:
    """FILE plus --rank/--tag for run directories."""
    func = click.option("--tag", default=None, help="Snapshot tag in a run directory (default: final).")(func)
    func = click.option("--rank", type=int, default=None, help="Rank in a run directory.")(func)
    return click.argument("file", type=click.Path(dir_okay=True, path_type=str))(func)


def _emit_json(doc: Any) -> None:
    click.echo(json.dumps(doc, indent=2, sort_keys=False, default=str))


@main.command()
@_input
@click.option("--top", default=5, show_default=True, type=click.IntRange(1), help="Peaks per device.")
@click.option("--device", type=int, default=None, help="Only this device.")
@click.option("--format", "fmt", type=FORMATS, default="table", show_default=True)
def peaks(file: str, rank: int | None, tag: str | None, top: int, device: int | None, fmt: str) -> None:
    """Baseline, top peaks and trace window of each device."""
    timeline = replay(load(file, rank, tag))
    if device is not None and device not in timeline.devices:
        raise UsageError(f"{file}: no device {device} (devices: {sorted(timeline.devices)})")
    df = find_peaks(timeline, top=top, device=device)
    doc = peaks_document(timeline, df)
    if fmt == "json":
        _emit_json(doc)
        return
    click.echo(_peaks_table(doc, timeline.check_invariants()))


def _peaks_table(doc: dict[str, Any], problems: list[str]) -> str:
    out = [f"{doc['source']}"]
    if not doc["devices"]:
        out.append("  no devices: the snapshot holds no segments and no trace")
    for d in doc["devices"]:
        window = text.fmt_duration_us(d["window_us"])
        out.append(f"\ndevice {d['device']}: {d['events']:,} events"
                   + (f" over {window}" if d["window_us"] is not None else " (no timestamps)")
                   + (f", from {text.fmt_time_us(d['first_time_us'])}" if d["first_time_us"] else ""))
        out.append(f"  baseline (live when the window began): {text.fmt_bytes(d['baseline_active_bytes'])}"
                   f" active, {text.fmt_bytes(d['baseline_reserved_bytes'])} reserved")
        rows = []
        for rank, p in enumerate(d["peaks"], start=1):
            event = "baseline" if p["event_index"] < 0 else f"{p['event_index']:,}"
            rows.append([str(rank), event, text.fmt_time_us(p["time_us"]), text.fmt_bytes(p["active_bytes"]),
                         text.fmt_bytes(p["reserved_bytes"]), text.fmt_bytes(p["allocated_est_bytes"]),
                         text.fmt_bytes(p["transient_bytes"]), text.fmt_duration_us(p["duration_us"])])
        out.append(text.table(["peak", "event", "time", "active", "reserved", "allocated (est.)",
                               "transient", "held"], rows, right=[True, True, False] + [True] * 5))
    out.append("\nactive = Σ requested bytes live (exact); allocated (est.) = rounded block sizes, an estimate.")
    if problems:
        out.append("warning: the replay does not match the end state:\n  " + "\n  ".join(problems))
    return "\n".join(out)


@main.command()
@_input
@click.option("--format", "fmt", type=FORMATS, default="table", show_default=True)
def summary(file: str, rank: int | None, tag: str | None, fmt: str) -> None:
    """What the file holds: format, torch version (inferred), devices, events, optional parts."""
    facts = summarize(load(file, rank, tag))
    if fmt == "json":
        _emit_json(facts)
        return
    click.echo(_summary_table(facts))


def _summary_table(f: dict[str, Any]) -> str:
    v = f["torch_version"]
    has = f["has"]
    out = [f"{f['source']}",
           f"  format: {f['container']}, {f['layout']}",
           f"  torch: {v['range']} (inferred from: {'; '.join(v['evidence']) or 'nothing'})"]
    for d in f["devices"]:
        actions = ", ".join(f"{k} {n:,}" for k, n in d["actions"].items()) or "none"
        span = text.fmt_duration_us(d["duration_us"]) if d["duration_us"] is not None else "no timestamps"
        out += [f"  device {d['device']}: {d['events']:,} events ({actions})",
                f"    window: {span}; ring buffer: {d['ring_buffer']}",
                f"    end state: {d['segments']:,} segments, {text.fmt_bytes(d['reserved_bytes'])} reserved, "
                f"{d['active_blocks']:,} active blocks; {d['events_with_frames']:,} events with frames"]
    yes = {True: "yes", False: "no"}
    out += [f"  frames: {yes[bool(has['frames'])]}; C++ frames: {yes[bool(has['cpp_frames'])]}; "
            f"annotations: {has['annotations']}; user_metadata entries: {has['user_metadata_entries']}; "
            f"compile_context: {yes[bool(has['compile_context'])]}",
            f"  private pools: {', '.join(has['private_pools']) or 'none'}; expandable segments: "
            f"{yes[bool(has['expandable_segments'])]}; legacy 2.0 blocks: {yes[bool(has['legacy_block_history'])]}"]
    settings = f["allocator_settings"]
    if settings:
        shown = {k: val for k, val in settings.items() if k != "roundup_power2_divisions"}
        divisions = {k: val for k, val in (settings.get("roundup_power2_divisions") or {}).items() if val}
        out.append("  allocator settings: " + ", ".join(f"{k}={val!r}" for k, val in shown.items())
                   + (f", roundup_power2_divisions={divisions}" if divisions else ""))
    else:
        out.append("  allocator settings: not recorded")
    if f["ooms"]:
        for o in f["ooms"]:
            out.append(f"  OOM on device {o['device']} at event {o['index']:,}: request "
                       f"{text.fmt_bytes(o['size'])}, device free {text.fmt_bytes(o['device_free'])}")
    else:
        out.append("  OOM entries: none")
    if f["unknown_actions"]:
        out.append(f"  unknown actions (ignored): {', '.join(f['unknown_actions'])}")
    return "\n".join(out)


@main.command()
@_input
@click.option("--at", "at", default="peak", show_default=True,
              help="Instant per device: peak, peak:N (Nth peak), event:I, time:T (µs since the epoch).")
@click.option("--device", type=int, default=None, help="Only this device.")
@click.option("--rules", "rules_file", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="A TOML file of your own categories and rules, layered over the shipped packs.")
@click.option("--top", default=3, show_default=True, type=click.IntRange(1), help="Sites shown per category.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table",
              show_default=True, help="csv prints one row per live block.")
@click.option("--explain", is_flag=True, help="Show which rule fired on which frame.")
def attribute(file: str, rank: int | None, tag: str | None, at: str, device: int | None, rules_file: str | None,
              top: int, fmt: str, explain: bool) -> None:
    """Attribute every live byte at a peak (or another instant) to a category."""
    rules = load_rules(rules_file)
    result = attribute_blocks(load(file, rank, tag), at=at, rules=rules, device=device)
    if fmt == "csv":
        click.echo(result.blocks.to_csv(index=False), nl=False)
        return
    doc = attribution_document(result, explain=explain)
    if fmt == "json":
        _emit_json(doc)
        return
    click.echo(_attribution_table(doc, top, explain))


def _attribution_table(doc: dict[str, Any], top: int, explain: bool) -> str:
    out = [doc["source"]]
    for d in doc["devices"]:
        p = d["peak"]
        where = "before the first event" if p["event_index"] < 0 else f"event {p['event_index']:,}"
        out.append(f"\ndevice {d['device']} at the {d['instant']} ({where}"
                   + (f", {text.fmt_time_us(p['time_us'])}" if p["time_us"] else "") + ")")
        out.append(f"  active {text.fmt_bytes(p['active_bytes'])} = baseline "
                   f"{text.fmt_bytes(d['baseline_active_bytes'])} + transient {text.fmt_bytes(d['transient_bytes'])};"
                   f" reserved {text.fmt_bytes(p['reserved_bytes'])}"
                   + (f"; made by request {d['request']!r}" if d["request"] else ""))
        rows = [[c["category"], text.fmt_bytes(c["bytes"]), text.fmt_share(c["share"]), f"{c['blocks']:,}",
                 "; ".join(c["top_frames"][:top])] for c in d["categories"]]
        out.append(text.table(["category", "bytes", "share", "blocks", "top allocation sites"], rows,
                              right=[False, True, True, True, False]))
        if explain:
            out.append("\n  why (rule → frame, largest first):")
            for e in d["explain"]:
                flag = " [inferred]" if e["inferred"] else ""
                tags = f" tags={','.join(e['tags'])}" if e["tags"] else ""
                out.append(f"  {text.fmt_bytes(e['bytes']):>10}  {e['category']}{tags} ← {e['rule']}{flag} "
                           f"@ {e['frame'] or '(no frame)'}\n{'':14}{e['reason']}")
    for note in doc["notes"]:
        out.append(f"note: {note}")
    return "\n".join(out)


@main.command()
@click.argument("inputs", nargs=-1, required=True, type=click.Path(dir_okay=True, path_type=str))
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Run directory to write (default: convert a run directory in place).")
@click.option("--rank", type=int, default=None, help="Rank of a single input file (default: from a rank=N "
              "parent directory, else 0).")
@click.option("--tag", default=None, help="Tag of a single input file (default: from snapshot-<tag>.pickle, "
              "else the file name).")
@click.option("--force", is_flag=True, help="Replace tables that already exist.")
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
