"""transformers GPTNeoXForCausalLM (Pythia layout: parallel attention and GELU MLP, rotary, untied LM head),
4 layers, hidden 256, 8 heads, intermediate 1,024, vocab 16,000, batch 2 × 128 tokens, built in float32 on the
device with its AdamW (foreach, lr 1e-4) before the recording. One forward with the labels (the model's own
cross-entropy), then the history is recorded from before loss.backward() (stacks="python"; the forward's saved
activations and the logits predate the window); after the backward the model is converted with
model.to(torch.bfloat16) — Module._apply copies each parameter into a bfloat16 tensor and then its .grad,
freeing the float32 storages one by one — and the AdamW step runs in bfloat16 (its moments made at that first
step, in bfloat16), then zero_grad(set_to_none=True)."""

import torch
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

TORCH = "2.11"


def main(cap):
    config = GPTNeoXConfig(vocab_size=16000, hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                           intermediate_size=1024, max_position_embeddings=512)
    model = GPTNeoXForCausalLM(config).cuda()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    input_ids = torch.randint(0, 16000, (2, 128), device="cuda")
    loss = model(input_ids=input_ids, labels=input_ids).loss
    cap.record_memory_history(stacks="python")
    loss.backward()
    model.to(torch.bfloat16)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer
