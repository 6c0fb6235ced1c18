"""transformers MistralForCausalLM with attn_implementation="eager" (the attention scores and probabilities are
materialised), 4 layers, hidden 256, 8 heads / 2 KV heads, vocab 32,000: one prefill forward of a 384-token prompt
× 2 with use_cache=True and logits_to_keep=1 (only the last position goes through lm_head, as generate()'s prefill
does) under torch.no_grad, keeping the DynamicCache it returns and an fp32 copy of the last position's logits. The
model is built on the host and moved with .to("cuda") inside the window; recording starts at the beginning
(stacks="python")."""

import torch
from transformers import MistralConfig, MistralForCausalLM

TORCH = "2.11"


def main(cap):
    config = MistralConfig(vocab_size=32000, hidden_size=256, intermediate_size=896, num_hidden_layers=4,
                           num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096,
                           sliding_window=None, tie_word_embeddings=False, attn_implementation="eager")
    cap.record_memory_history(max_entries=100000)
    with cap.host():
        model = MistralForCausalLM(config)
        prompt = torch.randint(1, 32000, (2, 384))
    model.to("cuda").eval()
    input_ids = prompt.to("cuda")
    attention_mask = torch.ones_like(input_ids)
    with torch.no_grad():
        out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=True, logits_to_keep=1)
        cache = out.cache
        next_logits = out.logits[:, -1, :].float().clone()
        del out
    return model, cache, next_logits
