"""`snapanalyze estimate --chunked-prefill`: the peak per chunk size (fake tensors) falls with the chunk, and the real
comparison on CPU catches a planted mask bug — an attention that drops the mask and lets SDPA's is_causal align
the causal triangle to the top left, so a later chunk's queries miss most of the cached keys — that the unchunked
prefill cannot show. Needs transformers (the zoo extra)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from snapanalyze.collect.estimate.prefill import chunked_prefill  # noqa: E402

CONFIG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              vocab_size=512, max_position_embeddings=65536)


def tiny() -> object:
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG))


def _drops_the_mask(module, query, key, value, attention_mask, **kwargs):  # type: ignore[no-untyped-def]
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    return sdpa_attention_forward(module, query, key, value, None, **kwargs)


def buggy() -> object:
    transformers.AttentionInterface.register("drops_the_mask", _drops_the_mask)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG, attn_implementation="drops_the_mask"))


def test_the_peak_falls_with_the_chunk_and_the_outputs_hold() -> None:
    result = chunked_prefill(tiny, [512, 2048, None], 8192, capacity=1 << 30)
    peaks = {r.chunk: r.peak_allocated for r in result.rows}
    assert peaks[512] < peaks[2048] < peaks[None]
    assert [r.steps for r in result.rows] == [16, 4, 1]
    assert all(r.held and r.tokens_differ == 0 for r in result.rows)
    assert result.fewest_steps_that_fit is not None and result.fewest_steps_that_fit.chunk is None


def test_a_planted_mask_bug_is_caught() -> None:
    result = chunked_prefill(buggy, [512, 2048, None], 8192)
    held = {r.chunk: r.held for r in result.rows}
    assert held[None] is True                          # the unchunked prefill is the reference
    assert held[512] is False and held[2048] is False
    assert max(r.max_abs_diff for r in result.rows) > 1e-2


def test_the_command_writes_one_estimate_per_chunk(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "snapanalyze", "estimate", "--chunked-prefill", "1024,none",
                          "--model", "test_estimate_prefill:tiny", "--prompt-tokens", "4096", "--capacity", "1GiB",
                          "-o", str(tmp_path / "prefill"), "--format", "json"],
                         capture_output=True, text=True, cwd=Path(__file__).parent,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)})
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["outputs_held"] is True and doc["estimate"] is True
    assert sorted(p.name for p in (tmp_path / "prefill").iterdir()) == ["tokens=4096-chunk=1024.pickle",
                                                                       "tokens=4096.pickle"]
