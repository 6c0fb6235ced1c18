"""transformers LlamaForCausalLM (SDPA attention, SwiGLU MLP), 4 layers, hidden 256, intermediate 1,024, 8 heads (4 KV
heads), vocab 1,024, with model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True}):
every decoder layer runs under torch.utils.checkpoint's reentrant CheckpointFunction and is re-run in the backward.
Batch 4 × 512 tokens, labels passed to the model (its own cross-entropy loss), use_cache=False, AdamW with
clip_grad_norm_(1.0): one warm-up step, then the history is recorded for a second step, so the weights and the AdamW
moments predate the window (the gradients were freed by zero_grad(set_to_none=True))."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

TORCH = "2.13"


def main(cap):
    config = LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512,
                         use_cache=False)
    with cap.host():
        model = LlamaForCausalLM(config)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    model.to("cuda")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    for step in range(2):
        if step == 1:
            cap.record_memory_history(max_entries=100000)
        with cap.host():
            batch = torch.randint(0, 1024, (4, 512))
        input_ids = batch.to("cuda")
        out = model(input_ids=input_ids, labels=input_ids)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model, optimizer
