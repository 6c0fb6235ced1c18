"""A tiny Llama-shaped model on CPU torch for the module-span tests (skipped where torch is missing)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn


class Attention(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x):  # type: ignore[no-untyped-def]
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        scores = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
        return self.o_proj(scores @ v)


class MLP(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = nn.Linear(d, 4 * d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.act_fn = nn.SiLU()

    def forward(self, x):  # type: ignore[no-untyped-def]
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = nn.LayerNorm(d), nn.LayerNorm(d)
        self.self_attn, self.mlp = Attention(d), MLP(d)

    def forward(self, x):  # type: ignore[no-untyped-def]
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 128, d: int = 32, layers: int = 2) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Block(d) for _ in range(layers))
        self.norm, self.lm_head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, ids):  # type: ignore[no-untyped-def]
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))
