"""A small decoder-only transformer LM with a hand-written mixture-of-experts feed-forward in every block: a
router Linear d → 8 with a softmax, top-2 routing (the two weights renormalised), 8 expert MLPs (256 → 512 → 256,
SiLU) each run on the tokens routed to it (gathered by index, scattered back with index_add_), a weighted
combine and a Switch-style load-balancing loss; causal self-attention through F.scaled_dot_product_attention,
RMSNorm pre-norm, tied embeddings. 4 layers, d 256, 8 heads, vocab 8,000, batch 8 × 128 tokens, one AdamW
(lr 3e-4) training step with gradient clipping. The recording starts first (stacks="all"), then the model is
built directly on the device, so the weights, gradients and AdamW moments are all made inside the window."""

import torch
import torch.nn as nn
import torch.nn.functional as F

TORCH = "2.13"


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, dim, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        q = self.wq(x).view(B, T, self.n_heads, -1).transpose(1, 2)
        k = self.wk(x).view(B, T, self.n_heads, -1).transpose(1, 2)
        v = self.wv(x).view(B, T, self.n_heads, -1).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(B, T, C))


class ExpertMLP(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)))


class TopKRouter(nn.Module):
    def __init__(self, dim, n_experts, k):
        super().__init__()
        self.gate = nn.Linear(dim, n_experts, bias=False)
        self.k = k

    def forward(self, x):
        probs = F.softmax(self.gate(x), dim=-1, dtype=torch.float32)
        weights, experts = torch.topk(probs, self.k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return probs, weights.to(x.dtype), experts


class SparseMoE(nn.Module):
    def __init__(self, dim, hidden, n_experts=8, k=2):
        super().__init__()
        self.router = TopKRouter(dim, n_experts, k)
        self.experts = nn.ModuleList([ExpertMLP(dim, hidden) for _ in range(n_experts)])
        self.n_experts = n_experts

    def forward(self, x):
        B, T, C = x.shape
        flat = x.reshape(-1, C)
        probs, weights, experts = self.router(flat)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token_idx, slot = torch.where(experts == e)
            if token_idx.numel() == 0:
                continue
            y = expert(flat[token_idx]) * weights[token_idx, slot, None]
            out = out.index_add(0, token_idx, y)
        # Switch Transformer load balancing: fraction of tokens per expert × mean router probability
        counts = F.one_hot(experts[:, 0], self.n_experts).float().mean(0)
        aux = self.n_experts * (counts * probs.mean(0)).sum()
        return out.view(B, T, C), aux


class TransformerBlock(nn.Module):
    def __init__(self, dim, n_heads, hidden, n_experts):
        super().__init__()
        self.attn_norm = RMSNorm(dim)
        self.attn = MultiHeadSelfAttention(dim, n_heads)
        self.ffn_norm = RMSNorm(dim)
        self.moe = SparseMoE(dim, hidden, n_experts)

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        y, aux = self.moe(self.ffn_norm(x))
        return x + y, aux


class MoETransformerLM(nn.Module):
    def __init__(self, vocab_size, dim=256, n_layers=4, n_heads=8, hidden=512, n_experts=8, max_len=512):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.pos_embeddings = nn.Embedding(max_len, dim)
        self.layers = nn.ModuleList([TransformerBlock(dim, n_heads, hidden, n_experts) for _ in range(n_layers)])
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab_size, bias=False)
        self.output.weight = self.tok_embeddings.weight

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok_embeddings(idx) + self.pos_embeddings(pos)
        aux_total = 0.0
        for layer in self.layers:
            x, aux = layer(x)
            aux_total = aux_total + aux
        logits = self.output(self.norm(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
            loss = loss + 0.01 * aux_total / len(self.layers)
        return logits, loss


def main(cap):
    vocab = 8000
    cap.record_memory_history(stacks="all")
    model = MoETransformerLM(vocab).to("cuda")
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, betas=(0.9, 0.95))
    model.train()
    with cap.host():
        data = torch.randint(0, vocab, (8, 129))
    data = data.to("cuda", non_blocking=True)
    x, y = data[:, :-1], data[:, 1:]
    logits, loss = model(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer
