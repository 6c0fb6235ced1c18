"""transformers LlamaForCausalLM (SDPA attention, SwiGLU MLP), 4 layers, hidden 256, 8 heads (2 KV heads), vocab
32,000, fp32 weights, inference in mixed precision: generate() over a batch of 4 prompts × 256 tokens, greedy,
32 new tokens with the dynamic KV cache, under torch.no_grad() and torch.autocast (bfloat16), so every Linear
runs in bf16 and autocast's weight cache keeps a bf16 copy of each Linear weight (the fp32 parameters still
require grad) until the autocast region exits; the KV cache and the logits are bf16. The model is built on the
host and moved with .to("cuda") before recording starts (the fp32 weights predate the window); recording starts
just before the prompts are moved to the device. Allocator setting expandable_segments:True."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

TORCH = "2.11"
SETTINGS = "expandable_segments:True"


def main(cap):
    config = LlamaConfig(vocab_size=32000, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024)
    with cap.host():
        model = LlamaForCausalLM(config)
        prompts = torch.randint(1, 32000, (4, 256))
    model.to("cuda").eval()
    model.generation_config.pad_token_id = 0
    cap.record_memory_history(max_entries=100000)
    input_ids = prompts.to("cuda")
    attention_mask = torch.ones_like(input_ids)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        tokens = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=32, do_sample=False)
    return model, tokens
