"""transformers Qwen2ForCausalLM with attn_implementation="sdpa" (q/k/v with bias, 8 heads, 2 KV heads), 4 layers,
hidden 256, vocab 12,000, inference on long prompts: generate() over a left-padded batch of 2 prompts (512 and
448 tokens, so a 4-D attention mask is built), greedy, 8 new tokens with the dynamic KV cache (generate's own
torch.no_grad()), under torch.nn.attention.sdpa_kernel(SDPBackend.MATH): every attention call takes the math
fallback, which materialises the 2 × 8 × 512 × 512 scores and their softmax during the prefill. The model is
built directly on the device before recording starts (its weights predate the window); recording uses
stacks="all" and starts just before the prompts are moved to the device."""

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import Qwen2Config, Qwen2ForCausalLM

TORCH = "2.11"


def main(cap):
    config = Qwen2Config(vocab_size=12000, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=False, attn_implementation="sdpa")
    model = Qwen2ForCausalLM(config).to("cuda").eval()
    model.generation_config.pad_token_id = 0
    with cap.host():
        input_ids = torch.randint(1, 12000, (2, 512))
        attention_mask = torch.ones(2, 512, dtype=torch.long)
        input_ids[1, :64] = 0                    # the shorter prompt, left-padded
        attention_mask[1, :64] = 0
    cap.record_memory_history(stacks="all", max_entries=100000)
    input_ids, attention_mask = input_ids.to("cuda"), attention_mask.to("cuda")
    with sdpa_kernel(SDPBackend.MATH):          # generate() runs under its own torch.no_grad()
        tokens = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=8, do_sample=False)
    return model, tokens
