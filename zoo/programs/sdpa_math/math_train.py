"""A hand-written decoder-only LM (nn.RMSNorm pre-norm blocks: an Attention module with separate q/k/v/o
Linears calling F.scaled_dot_product_attention(is_causal=True, dropout_p=0.1), and a SwiGLU FeedForward),
4 layers, d 256, 8 heads, vocab 4,000, batch 4 × 256 tokens. The whole training step runs under
torch.nn.attention.sdpa_kernel(SDPBackend.MATH), so attention takes the math fallback: the 4 × 8 × 256 × 256
scores, their softmax and the dropout mask are materialised per layer, saved for the backward, and their
gradients made in it. AdamW, one training step; recording starts first and the model is built directly on the
device inside the window, so weights, gradients and AdamW moments are all made in it."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

TORCH = "2.13"


class Attention(nn.Module):
    def __init__(self, dim, n_heads, dropout):
        super().__init__()
        self.n_heads, self.dropout = n_heads, dropout
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        q = self.wq(x).view(B, T, self.n_heads, -1).transpose(1, 2)
        k = self.wk(x).view(B, T, self.n_heads, -1).transpose(1, 2)
        v = self.wv(x).view(B, T, self.n_heads, -1).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.wo(y.transpose(1, 2).reshape(B, T, C))


class FeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, dim, n_heads, hidden, dropout):
        super().__init__()
        self.attention_norm = nn.RMSNorm(dim)
        self.attention = Attention(dim, n_heads, dropout)
        self.ffn_norm = nn.RMSNorm(dim)
        self.feed_forward = FeedForward(dim, hidden)

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self, vocab, dim=256, n_layers=4, n_heads=8, hidden=688, max_len=512, dropout=0.1):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.pos_embeddings = nn.Embedding(max_len, dim)
        self.layers = nn.ModuleList(Block(dim, n_heads, hidden, dropout) for _ in range(n_layers))
        self.norm = nn.RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        x = self.tok_embeddings(tokens) + self.pos_embeddings(torch.arange(tokens.shape[1], device=tokens.device))
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


def main(cap):
    cap.record_memory_history(stacks="python")
    model = Transformer(vocab=4000).to("cuda")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    with cap.host():
        tokens = torch.randint(0, 4000, (4, 257))
    tokens = tokens.to("cuda")
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    with sdpa_kernel(SDPBackend.MATH):
        logits = model(inputs)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer
