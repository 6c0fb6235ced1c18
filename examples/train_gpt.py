"""A GPT-style decoder's training step, written as a GPU program is: the example `snapanalyze estimate` runs in the
README (fake tensors on a CPU: no GPU, no data, no compute, so its real shapes run anywhere).

    python examples/train_gpt.py --batch 4 --tokens 4096 --checkpoint            # on a GPU
    snapanalyze estimate --capacity 24GiB --shape batch=1,2,4,8 -o sweep -- \
        python examples/train_gpt.py --batch {batch} --tokens 4096 --checkpoint   # anywhere: which batch fits 24 GB

A 24-layer decoder of width 1024 (about 350M parameters, a 50,304-token vocabulary) with SDPA attention, an MLP of
4×, bf16 autocast and AdamW; `--checkpoint` recomputes each block in the backward (activation checkpointing).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(b, t, d))

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(self.norm2(x))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(x)
        return x + self.mlp(x)


class GPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, checkpointing: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        self.checkpointing = checkpointing

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointing else block(x)
        return self.head(self.norm(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--d-model", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--checkpoint", action="store_true")
    args = parser.parse_args()
    device = torch.device("cuda")
    model = GPT(args.vocab, args.d_model, args.layers, args.heads, args.checkpoint).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    ids = torch.randint(0, args.vocab, (args.batch, args.tokens + 1), device=device)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    print(f"peak allocated {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
