"""A hand-written pre-norm transformer LM (LayerNorm → causal self-attention through
F.scaled_dot_product_attention → residual, LayerNorm → GELU MLP → residual), 4 layers, d 256, 8 heads, vocab
1,024, batch 8 × 512 tokens, each block run under torch.utils.checkpoint.checkpoint(block, x,
use_reentrant=False) so only the block inputs are kept and each block's forward is recomputed in the backward;
one AdamW training step. The model is built on the device before recording starts (its weights predate the
window); the batch is made on the host and moved with .to("cuda") inside the window, where the AdamW moments
and the gradients are first made."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

TORCH = "2.13"


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, n_head):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, d_model, hidden):
        super().__init__()
        self.fc = nn.Linear(d_model, hidden)
        self.act = nn.GELU()
        self.out = nn.Linear(hidden, d_model)

    def forward(self, x):
        return self.out(self.act(self.fc(x)))


class Block(nn.Module):
    def __init__(self, d_model, n_head):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, 4 * d_model)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TransformerLM(nn.Module):
    def __init__(self, vocab, d_model, n_head, n_layer, max_len):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_head) for _ in range(n_layer))
        self.norm = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return self.lm_head(self.norm(x))


def main(cap):
    model = TransformerLM(vocab=1024, d_model=256, n_head=8, n_layer=4, max_len=512).to("cuda")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    with cap.host():
        tokens = torch.randint(0, 1024, (8, 513))
    cap.record_memory_history(max_entries=200000)
    tokens = tokens.to("cuda", non_blocking=True)
    x, y = tokens[:, :-1], tokens[:, 1:]
    logits = model(x)
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer
