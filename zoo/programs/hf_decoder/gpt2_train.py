"""transformers GPT2LMHeadModel with attn_implementation="eager" (the attention scores and probabilities are
materialised and saved for the backward), 4 layers, n_embd 256, 8 heads, n_ctx 256, vocab 16,000 (tied
embeddings), batch 2 × 256 tokens, trained with torch.optim.Adam on its own cross-entropy loss (labels passed to
the model): one warm-up step, then the history recorded for a second step (stacks="python"): the weights and
Adam's moments predate the window, the gradients of the first step are freed by zero_grad(set_to_none=True) before
the second forward."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

TORCH = "2.1"


def main(cap):
    config = GPT2Config(vocab_size=16000, n_positions=256, n_embd=256, n_layer=4, n_head=8,
                        attn_implementation="eager", use_cache=False, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config).to("cuda")
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=2.5e-4)
    for step in range(2):
        if step == 1:
            cap.record_memory_history(stacks="python", max_entries=100000)
        with cap.host():
            batch = torch.randint(0, 16000, (2, 256))
        input_ids = batch.to("cuda", non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        out = model(input_ids=input_ids, labels=input_ids)
        out.loss.backward()
        optimizer.step()
    return model, optimizer
