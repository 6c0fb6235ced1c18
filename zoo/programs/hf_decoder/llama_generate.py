"""transformers LlamaForCausalLM generate(): a 200-token prompt × 2, greedy, 24 new tokens with the dynamic KV
cache, under torch.inference_mode, stacks="all". The model is built on the device before recording starts."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

TORCH = "2.11"


def main(cap):
    config = LlamaConfig(vocab_size=16000, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024)
    model = LlamaForCausalLM(config).to("cuda").eval()
    model.generation_config.pad_token_id = 0
    prompt = torch.randint(1, 16000, (2, 200), device="cuda")
    cap.record_memory_history(stacks="all")
    with torch.inference_mode():
        model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=24, do_sample=False)
    return model
