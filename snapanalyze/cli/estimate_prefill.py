"""`snapanalyze estimate --chunked-prefill`: the peak per chunk size, the fewest steps that fit, and whether the
outputs held (`collect.estimate.prefill`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import UsageError
from .common import echo_text, emit_json
from .progress import Progress

if TYPE_CHECKING:
    from ..collect.estimate.prefill import ChunkedPrefill


def chunked_prefill(chunked: str, model: str | None, prompt_tokens: int | None, check_tokens: int,
                    capacity: int | None, settings: str, output: str, force: bool, fmt: str) -> None:
    from ..session.estimate import chunked_prefill_files

    if model is None or prompt_tokens is None:
        raise UsageError("--chunked-prefill needs --model (a model folder or package.module:function) and "
                         "--prompt-tokens")
    with Progress() as progress:
        progress.step("estimating each chunk size (fake tensors) and checking its outputs on CPU")
        result = chunked_prefill_files(model, chunked, prompt_tokens, output, check_tokens=check_tokens,
                                       capacity=capacity, settings=settings, force=force)
    if fmt == "json":
        emit_json({**result.to_json(), "folder": output})
        return
    echo_text(render(result, output), None)


def render(result: ChunkedPrefill, folder: str) -> str:
    from ..report.text import table
    from ..units import fmt_bytes
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
