"""transformers Qwen2ForCausalLM (SDPA attention, SwiGLU MLP, tied embeddings off), 2 layers, hidden 256, vocab
32,000, generate() with sampling (do_sample, top_k 50, top_p 0.9, temperature 0.8: transformers' logits processors
and warpers) on a batch of 4 prompts × 128 tokens, 16 new tokens, with the dynamic KV cache (the prefill keeps only
the last position's logits), under torch.no_grad. The model is built on the host and moved with .to("cuda") before
the history is recorded, so the weights predate the window; the prompt is a host batch copied to the device inside
it (stacks="python")."""

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

TORCH = "2.6"


def main(cap):
    config = Qwen2Config(vocab_size=32000, hidden_size=256, intermediate_size=704, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=False)
    with cap.host():
        model = Qwen2ForCausalLM(config)
        prompt = torch.randint(3, 32000, (4, 128))
    model.to("cuda").eval()
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    cap.record_memory_history(stacks="python", max_entries=100000)
    input_ids = prompt.to("cuda")
    attention_mask = torch.ones_like(input_ids)
    with torch.no_grad():
        out = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=16, min_new_tokens=16,
                             do_sample=True, top_k=50, top_p=0.9, temperature=0.8)
    return model, out
