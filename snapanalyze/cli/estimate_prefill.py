"""`snapanalyze estimate --chunked-prefill`: the peak per chunk size, the fewest steps that fit, and whether the
outputs held (`collect.estimate.prefill`)."""

from __future__ import annotations

import functools
import pickle
from pathlib import Path
from typing import Any

import click

from ..errors import UsageError
from .common import emit_json
from .progress import Progress


def chunked_prefill(chunked: str, model: str | None, prompt_tokens: int | None, check_tokens: int,
                    capacity: int | None, settings: str, output: str, force: bool, fmt: str) -> None:
    from ..atomic import write_atomic
    from ..collect.estimate.prefill import chunked_prefill as run
    from ..collect.estimate.prefill import model_factory, parse_chunks

    if model is None or prompt_tokens is None:
        raise UsageError("--chunked-prefill needs --model (a model folder or package.module:function) and "
                         "--prompt-tokens")
    chunks = parse_chunks(chunked)
    folder = Path(output)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())) and not force:
        raise UsageError(f"{folder}: exists (--force replaces the estimates in it)")
    with Progress() as progress:
        progress.step(f"estimating {len(chunks)} chunk sizes (fake tensors) and checking their outputs on CPU")
        result = run(model_factory(model), chunks, prompt_tokens, capacity=capacity, settings=settings,
                     check_tokens=check_tokens)
    folder.mkdir(parents=True, exist_ok=True)
    for row, snapshot in zip(result.rows, result.snapshots):
        name = f"tokens={prompt_tokens}" + (f"-chunk={row.chunk}" if row.chunk else "") + ".pickle"
        write_atomic(folder / name, functools.partial(_dump, snapshot))
    if fmt == "json":
        emit_json({**result.to_json(), "folder": str(folder)})
        return
    click.echo(render(result, str(folder)))


def _dump(snapshot: dict[str, Any], f: Any) -> None:
    pickle.dump(snapshot, f, protocol=4)


def render(result: object, folder: str) -> str:
    from ..collect.estimate.prefill import ChunkedPrefill
    from ..report.text import table
    from ..units import fmt_bytes
    assert isinstance(result, ChunkedPrefill)
    out = [f"chunked prefill of {result.prompt_tokens:,} prompt tokens: an estimate (fake tensors on this CPU, no GPU);"
           f" outputs checked for real on CPU at {result.check_tokens} tokens (same number of steps)"]
    rows = []
    for r in result.rows:
        fits = "" if r.fits is None else ("fits" if r.fits else "OUT OF MEMORY")
        rows.append([f"{r.chunk:,}" if r.chunk else "none", f"{r.steps:,}", fmt_bytes(r.peak_allocated),
                     fmt_bytes(r.peak_reserved), fits, f"{r.max_abs_diff:.2e}",
                     f"{r.tokens_differ}/{result.continue_tokens}", "yes" if r.held else "NO"])
    out.append(table(["chunk", "steps", "peak active", "peak reserved", "capacity", "max |Δ logit|",
                      "tokens differ", "outputs held"], rows, right=[True, True, True, True, False, True, True, False]))
    best = result.fewest_steps_that_fit
    if result.capacity is not None:
        out.append(f"fewest steps that fit {fmt_bytes(result.capacity)}: "
                   + (f"chunk {best.chunk:,} ({best.steps:,} steps)" if best and best.chunk else
                      "unchunked (1 step)" if best else "none of these"))
    bad = [r for r in result.rows if not r.held]
    if bad:
        out.append("outputs did NOT hold for chunk " + ", ".join(f"{r.chunk}" for r in bad)
                   + ": the chunked prefill gives other logits or another continuation than the unchunked one "
                     "(a position or mask bug)")
    for choice in result.choices:
        out.append(f"modelled as on CUDA: {choice}")
    out.append(f"estimates: {folder}/ (snapanalyze attribute, report, capacity read them)")
    return "\n".join(out)
