"""transformers GPT2LMHeadModel (eager attention, GELU MLP), 4 layers, n_embd 256, 8 heads, vocab 8,000, batch
4 × 256 tokens, trained with mixed precision: the forward and the loss run under torch.autocast (float16) with
the labels passed to the model (its own cross-entropy loss over the upcast logits), then
torch.amp.GradScaler: scaler.scale(loss).backward(), scaler.unscale_(optimizer), clip_grad_norm_(1.0),
scaler.step(optimizer), scaler.update(). AdamW, one training step. Recording starts first: the model is built on
the host and moved with .to("cuda") inside the window, so the fp32 weights, the autocast fp16 copies of the
weights, the gradients and the AdamW moments are all made in it."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

TORCH = "2.13"


def main(cap):
    cap.record_memory_history(max_entries=200000)
    config = GPT2Config(vocab_size=8000, n_positions=512, n_embd=256, n_layer=4, n_head=8,
                        attn_implementation="eager")
    with cap.host():
        model = GPT2LMHeadModel(config)
        batch = torch.randint(0, 8000, (4, 256))
    model.to("cuda")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    scaler = torch.amp.GradScaler("cpu")
    input_ids = batch.to("cuda")
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(input_ids=input_ids, labels=input_ids)
    scaler.scale(out.loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer, scaler
