"""transformers LlamaForCausalLM (SDPA attention, SwiGLU MLP), 4 layers, hidden 256, vocab 8,000, batch 4 × 256
tokens, one AdamW training step with the labels passed to the model (its own cross-entropy loss). The model is
built on the host and moved with .to("cuda") inside the recording."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

TORCH = "2.13"


def main(cap):
    config = LlamaConfig(vocab_size=8000, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512)
    with cap.host():
        model = LlamaForCausalLM(config)
        batch = torch.randint(0, 8000, (4, 256))
    cap.record_memory_history(max_entries=200000)
    model.to("cuda")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    input_ids = batch.to("cuda")
    out = model(input_ids=input_ids, labels=input_ids)
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer
