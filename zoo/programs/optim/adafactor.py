"""A small causal language model built from torch.nn's own transformer (an nn.Embedding, an nn.TransformerEncoder
of 4 pre-norm nn.TransformerEncoderLayer — nn.MultiheadAttention self-attention with a causal mask, a GELU
feed-forward 256 → 1,024 → 256 — and a Linear LM head), d 256, 8 heads, vocab 6,000, batch 8 × 128 tokens,
trained with torch.optim.Adafactor (lr 1e-2, factored second moments: a row and a column vector per matrix).
The model is built on the device; one warm-up step, then the history recorded (stacks="all") for the second
step only, so the weights and Adafactor's factored state predate the window; the gradients are zeroed to None
before each backward."""

import torch
import torch.nn as nn
import torch.nn.functional as F

TORCH = "2.13"


class CausalLM(nn.Module):
    def __init__(self, vocab_size, d_model=256, n_heads=8, n_layers=4, d_ff=1024, max_len=512):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Parameter(torch.zeros(1, max_len, d_model))
        layer = nn.TransformerEncoderLayer(d_model, n_heads, d_ff, dropout=0.1, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, idx):
        T = idx.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(T, device=idx.device)
        x = self.embed(idx) + self.pos[:, :T]
        x = self.encoder(x, mask=mask, is_causal=True)
        return self.lm_head(self.norm(x))


def main(cap):
    vocab = 6000
    model = CausalLM(vocab).to("cuda")
    optimizer = torch.optim.Adafactor(model.parameters(), lr=1e-2)
    model.train()
    for step in range(2):
        if step == 1:
            cap.record_memory_history(stacks="all")
        with cap.host():
            tokens = torch.randint(0, vocab, (8, 129))
        tokens = tokens.to("cuda", non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
    return model, optimizer
