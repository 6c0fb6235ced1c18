"""A small hand-written decoder-only transformer LM (pre-norm blocks: a causal self-attention through
F.scaled_dot_product_attention, a GELU feed-forward; tied input/output embeddings), 4 layers, d 256, 8 heads,
vocab 8,192, batch 4 × 128 tokens, trained with torch.optim.Adam (the default foreach implementation, lr 3e-4).
The model is built on the host; the history is recorded from the start (stacks="python"), before the
model.to("cuda"), so the weights, the Adam moments (created lazily at the first step) and the gradients are all
inside the window; one training step, the gradients zeroed to None after it; the logits stay referenced through the
optimizer step."""

import torch
import torch.nn as nn
import torch.nn.functional as F

TORCH = "2.11"


class SelfAttention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, C // self.n_heads).permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(B, T, C))


class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, d_model, n_heads, d_ff):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, n_heads)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff = FeedForward(d_model, d_ff)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.ff(self.norm2(x))


class TransformerLM(nn.Module):
    def __init__(self, vocab_size, max_len, d_model=256, n_heads=8, n_layers=4):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList([Block(d_model, n_heads, 4 * d_model) for _ in range(n_layers)])
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def main(cap):
    vocab = 8192
    with cap.host():
        model = TransformerLM(vocab, max_len=128)
        tokens = torch.randint(0, vocab, (4, 129))
    cap.record_memory_history(stacks="python")
    model.to("cuda")
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)
    batch = tokens.to("cuda")
    inputs, targets = batch[:, :-1], batch[:, 1:]
    logits = model(inputs)
    loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer
