"""Chunked prefill, checked both ways: the peak per chunk size at the real prompt length (fake tensors), and the
outputs of each chunk size against the unchunked prefill for real on the CPU at a small prompt length.

Contract: `chunked_prefill(factory, chunks, prompt_tokens, …)` returns a `ChunkedPrefill`: per chunk size (None =
unchunked) the steps, the estimate's peak active and reserved bytes (`estimate.run`: the model built by
`factory()` in `dtype` on the emulated device, the prompt prefilled through its cache, ``chunk`` tokens per forward,
under inference_mode) and whether it fits `capacity`; and the real comparison: the same model (`factory()`, float32,
its own weights or seeded random ones) prefilling a `check_tokens`-token prompt with each chunk size scaled to the
same number of steps, its last-position logits and its greedy continuation of `continue_tokens` tokens against the
unchunked prefill's (max abs difference, tokens that differ). `factory` builds a transformers causal LM (anything
called as ``model(input_ids=…, past_key_values=cache, use_cache=True)`` returning ``.logits`` and
``.past_key_values``); `model_factory(name)` makes one from a folder with a ``config.json`` (its weights when the
folder holds them) or from ``package.module:function``.
"""

from __future__ import annotations

import importlib
import inspect
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import CollectorError

Factory = Callable[[], Any]


@dataclass(frozen=True)
class ChunkRow:
    chunk: int | None                 # tokens per step (None: the whole prompt in one forward)
    steps: int
    peak_allocated: int
    peak_reserved: int
    fits: bool | None                 # None: no capacity given
    check_chunk: int | None           # the chunk size of the real comparison (the same number of steps)
    max_abs_diff: float               # last-position logits against the unchunked prefill's
    tokens_differ: int                # of the greedy continuation
    held: bool


@dataclass(frozen=True)
class ChunkedPrefill:
    prompt_tokens: int
    check_tokens: int
    continue_tokens: int
    capacity: int | None
    rows: tuple[ChunkRow, ...]
    choices: tuple[str, ...]
    snapshots: tuple[dict[str, Any], ...] = field(default=(), repr=False)   # each row's estimate, in order

    @property
    def fewest_steps_that_fit(self) -> ChunkRow | None:
        fitting = [r for r in self.rows if r.fits]
        return min(fitting, key=lambda r: r.steps) if fitting else None

    def to_json(self) -> dict[str, Any]:
        best = self.fewest_steps_that_fit
        return {"prompt_tokens": self.prompt_tokens, "check_tokens": self.check_tokens,
                "continue_tokens": self.continue_tokens, "capacity": self.capacity, "estimate": True,
                "rows": [r.__dict__ for r in self.rows], "choices": list(self.choices),
                "fewest_steps_that_fit": None if best is None else best.chunk,
                "outputs_held": all(r.held for r in self.rows)}


def parse_chunks(text: str) -> list[int | None]:
    """`512,2048,none` → [512, 2048, None]."""
    out: list[int | None] = []
    for part in text.split(","):
        part = part.strip().lower()
        if part in ("none", "0", "off", "unchunked"):
            out.append(None)
            continue
        try:
            value = int(part)
        except ValueError:
            raise CollectorError(f"--chunked-prefill: {part!r} is not a chunk size (whole tokens, or none)") from None
        if not 0 < value < 1 << 31:
            raise CollectorError(f"--chunked-prefill: {value} is out of range")
        out.append(value)
    if None not in out:
        out.append(None)                  # the unchunked prefill: what every chunk size is checked against
    return out


def model_factory(name: str, dtype: Any = None) -> Factory:
    """A factory of the causal LM a user names: ``package.module:function`` (called with no arguments) or a folder
    holding a transformers ``config.json`` (its weights when it holds them: ``from_pretrained``)."""
    if ":" in name and not os.path.exists(name):
        module, _, attr = name.partition(":")
        try:
            found = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise CollectorError(f"--model {name}: {exc}") from None
        return found  # type: ignore[no-any-return]
    if not os.path.isfile(os.path.join(name, "config.json")):
        raise CollectorError(f"--model {name}: no config.json there (a model folder, or package.module:function)")

    def make() -> Any:
        import torch
        from torch._subclasses.fake_tensor import FakeTensor
        from transformers import AutoConfig, AutoModelForCausalLM
        weights = any(f.endswith((".safetensors", ".bin")) for f in os.listdir(name))
        if weights and not isinstance(torch.empty(0), FakeTensor):     # the real check reads the user's weights
            return AutoModelForCausalLM.from_pretrained(name)
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(name))
    return make


def _cache_argument(model: Any) -> str:
    """The name a model's forward takes its cache by: `cache` (transformers ≥ 5.2x) or `past_key_values`."""
    try:
        return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    except (TypeError, ValueError):
        return "past_key_values"


def _prefill(model: Any, ids: Any, chunk: int | None) -> tuple[Any, Any]:
    """Prefill `ids` through the model's cache (a DynamicCache, filled in place), `chunk` tokens per forward:
    (last-position logits, the cache)."""
    from transformers import DynamicCache
    cache, name = DynamicCache(), _cache_argument(model)
    step = chunk or ids.shape[1]
    out = None
    for start in range(0, ids.shape[1], step):
        out = model(input_ids=ids[:, start:start + step], use_cache=True, **{name: cache})
    assert out is not None
    return out.logits[:, -1, :], cache


def _greedy(model: Any, logits: Any, cache: Any, n: int) -> list[int]:
    tokens, name = [], _cache_argument(model)
    for _ in range(n):
        nxt = logits.argmax(-1, keepdim=True)
        tokens.append(int(nxt[0, 0]))
        logits = model(input_ids=nxt, use_cache=True, **{name: cache}).logits[:, -1, :]
    return tokens


def chunked_prefill(factory: Factory, chunks: Sequence[int | None], prompt_tokens: int, *,
                    capacity: int | None = None, settings: str = "", check_tokens: int = 64,
                    continue_tokens: int = 8, dtype: str = "bfloat16", seed: int = 0) -> ChunkedPrefill:
    import torch

    from . import run

    def estimate_one(chunk: int | None) -> Any:
        def main() -> None:
            model = factory().to(getattr(torch, dtype)).to("cuda").eval()
            vocab = int(model.config.vocab_size)
            ids = torch.randint(0, vocab, (1, prompt_tokens), device="cuda")
            with torch.inference_mode():
                _prefill(model, ids, chunk)
        return run(main, capacity=capacity, settings=settings,
                   shapes={"tokens": prompt_tokens, **({"chunk": chunk} if chunk else {})})

    torch.manual_seed(seed)
    reference = factory().float().eval()
    ids = torch.randint(0, int(reference.config.vocab_size), (1, check_tokens),
                        generator=torch.Generator().manual_seed(seed))
    with torch.inference_mode():
        base_logits, base_cache = _prefill(reference, ids, None)
        base_tokens = _greedy(reference, base_logits, base_cache, continue_tokens)
    rows: list[ChunkRow] = []
    choices: list[str] = []
    snapshots: list[dict[str, Any]] = []
    for chunk in chunks:
        made = estimate_one(chunk)
        snapshots.append(made.snapshot)
        choices.extend(c for c in (re.sub(r" ×\d+", "", c) for c in made.choices) if c not in choices)
        steps = 1 if chunk is None else math.ceil(prompt_tokens / chunk)
        small = None if chunk is None else max(1, math.ceil(check_tokens / steps))
        with torch.inference_mode():
            logits, cache = _prefill(reference, ids, small)
            tokens = _greedy(reference, logits, cache, continue_tokens)
        diff = float((logits - base_logits).abs().max())
        differ = sum(a != b for a, b in zip(tokens, base_tokens))
        scale = max(1.0, float(base_logits.abs().max()))
        rows.append(ChunkRow(chunk, steps, made.peak_allocated, made.peak_reserved, made.fits, small, diff, differ,
                             held=differ == 0 and diff <= 1e-3 * scale))
    return ChunkedPrefill(prompt_tokens, check_tokens, continue_tokens, capacity, tuple(rows), tuple(choices),
                          tuple(snapshots))
