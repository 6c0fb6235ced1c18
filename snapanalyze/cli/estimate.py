"""`snapanalyze estimate`: a program's peak, attributed, before there is a GPU (fake tensors on this CPU)."""

from __future__ import annotations

import itertools
import sys
from typing import TYPE_CHECKING

import click

from ..errors import UsageError
from . import main
from .common import SIZE, echo_text, emit_json, format_option
from .progress import Progress

if TYPE_CHECKING:
    from ..session.estimate import EstimateSummary


def _shapes(ctx: click.Context, param: click.Parameter, items: tuple[str, ...]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for item in items:
        name, sep, values = item.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier():
            raise click.BadParameter(f"{item!r}: write NAME=VALUE or NAME=V1,V2,… (e.g. batch=8)", ctx, param)
        try:
            numbers = [int(v) for v in values.split(",")]
        except ValueError:
            raise click.BadParameter(f"{item!r}: values are whole numbers", ctx, param) from None
        if any(n < 0 or n >= 1 << 40 for n in numbers):
            raise click.BadParameter(f"{item!r}: a value is out of range (0 … 2⁴⁰)", ctx, param)
        out[name] = numbers
    return out


@main.command()
@click.argument("program", nargs=-1, required=False, type=click.UNPROCESSED)
@click.option("-o", "--output", required=True, type=click.Path(path_type=str),
              help="The estimate's snapshot (.pickle); with several shapes, a folder with one per shape.")
@click.option("--shape", "shapes", multiple=True, callback=_shapes, metavar="NAME=VALUE[,VALUE…]",
              help="A shape the program takes: {NAME} in its arguments becomes VALUE (and SNAPANALYZE_SHAPE_NAME is "
                   "set). Several values make a sweep, one estimate per shape, for `snapanalyze capacity`.")
@click.option("--capacity", type=SIZE, default=None,
              help="The device's memory, e.g. 80GiB: an allocation past it is an out-of-memory, as on the GPU.")
@click.option("--set", "changes", multiple=True, metavar="KEY:VALUE",
              help="An allocator setting, as in PYTORCH_CUDA_ALLOC_CONF (repeatable), e.g. expandable_segments:True.")
@click.option("--torch-layout", "torch_layout", default="2.13", show_default=True,
              type=click.Choice(["2.1", "2.6", "2.11", "2.13"]), help="The snapshot layout to write.")
@click.option("--chunked-prefill", "chunked", default=None, metavar="SIZES",
              help="Chunk sizes to compare (e.g. 512,2048,8192,none) for --model at --prompt-tokens: the peak per "
                   "chunk size (fake tensors), and the outputs of each against the unchunked prefill on CPU.")
@click.option("--model", default=None, help="--chunked-prefill: a transformers model (a local folder or config).")
@click.option("--prompt-tokens", "prompt_tokens", type=click.IntRange(1), default=None,
              help="--chunked-prefill: the prompt length to estimate at.")
@click.option("--check-tokens", "check_tokens", type=click.IntRange(2), default=64, show_default=True,
              help="--chunked-prefill: the prompt length of the real comparison on CPU.")
@click.option("--force", is_flag=True, help="Replace an estimate that already exists.")
@format_option()
def estimate(program: tuple[str, ...], output: str, shapes: dict[str, list[int]], capacity: int | None,
             changes: tuple[str, ...], torch_layout: str, chunked: str | None, model: str | None,
             prompt_tokens: int | None, check_tokens: int, force: bool, fmt: str) -> None:
    """Estimate PROGRAM's GPU memory here, without a GPU: `snapanalyze estimate -o est.pickle -- python train.py ARGS`.

    The program runs with fake tensors (shapes, no data, no compute) on an emulated CUDA device: its allocations go
    through the caching-allocator model and are written as a real-format snapshot marked as an estimate, which every
    command reads (`attribute`, `report`, `whatif`, `phases`, `diff`, `check`; `capacity` over a sweep)."""
    settings = ",".join(changes)
    if chunked is not None:
        from .estimate_prefill import chunked_prefill
        chunked_prefill(chunked, model, prompt_tokens, check_tokens, capacity, settings, output, force, fmt)
        return
    from ..session.estimate import estimate_file, estimate_sweep
    if not program:
        raise UsageError("estimate: give the program after --, e.g. snapanalyze estimate -o est.pickle -- python "
                         "train.py")
    points = [dict(zip(shapes, values)) for values in itertools.product(*shapes.values())]
    if len(points) > 1:
        with Progress() as progress:
            progress.step(f"estimating {len(points)} shapes (fake tensors), one interpreter each")
            rows = estimate_sweep(program, points, output, capacity=capacity, changes=changes,
                                  torch_layout=torch_layout, force=force)
        if fmt == "json":
            emit_json({"sweep": output, "points": [r.to_json() for r in rows]})
        else:
            echo_text(_render_sweep(output, rows, capacity), None)
        return
    with Progress() as progress:
        progress.step("estimating (fake tensors)")
        summary = estimate_file(program, points[0] if points else {}, output, capacity=capacity, settings=settings,
                                torch_layout=torch_layout, force=force)
    if fmt == "json":
        emit_json(summary.to_json())
    else:
        echo_text(_render(summary), None)
    if summary.oom:
        sys.exit(1)


def _render(s: EstimateSummary) -> str:
    from ..units import fmt_bytes
    out = [f"{s.estimate}: an estimate (fake tensors on this CPU, no GPU) of {' '.join(s.program)}"]
    if s.shapes:
        out.append("  shapes: " + ", ".join(f"{k}={v}" for k, v in s.shapes.items()))
    line = f"  peak active {fmt_bytes(s.peak_allocated)}, peak reserved {fmt_bytes(s.peak_reserved)}"
    if s.capacity is not None:
        if s.oom:
            line += f": does NOT fit in {fmt_bytes(s.capacity)} (out of memory" + \
                (f" at {s.oom_at})" if s.oom_at else ")")
        else:
            line += f" of {fmt_bytes(s.capacity)}: fits ({fmt_bytes(s.capacity - s.peak_reserved)} to spare)"
    out.append(line)
    if s.categories:
        total = sum(c["bytes"] for c in s.categories) or 1
        out.append("  what holds the peak: " + ", ".join(
            f"{c['category']} {fmt_bytes(c['bytes'])} ({c['bytes'] / total:.0%}"
            + (", inferred" if c["inferred_bytes"] * 2 > c["bytes"] else "") + ")"
            for c in s.categories[:6]))
    for choice in s.choices:
        out.append(f"  modelled as on CUDA: {choice}")
    out.append(f"  next: snapanalyze attribute {s.estimate}  ·  snapanalyze report {s.estimate}")
    return "\n".join(out)


def _render_sweep(folder: str, rows: list[EstimateSummary], capacity: int | None) -> str:
    from ..units import fmt_bytes
    out = [f"{folder}: {len(rows)} estimates (fake tensors on this CPU, no GPU)"]
    for r in rows:
        text = ", ".join(f"{k}={v}" for k, v in r.shapes.items())
        verdict = "" if r.capacity is None else ("  OUT OF MEMORY" if r.oom else "  fits")
        out.append(f"  {text:<30} peak active {fmt_bytes(r.peak_allocated):>11}  reserved "
                   f"{fmt_bytes(r.peak_reserved):>11}{verdict}")
    fitting = [r for r in rows if r.fits]
    if capacity is not None:
        out.append("  largest that fits: " + (", ".join(f"{k}={v}" for k, v in fitting[-1].shapes.items())
                                              if fitting else "none"))
    out.append(f"  next: snapanalyze capacity {folder}/*.pickle"
               + (f" --budget {capacity / 2**30:g}GiB" if capacity is not None else ""))
    return "\n".join(out)
