"""transformers LlamaForCausalLM (SDPA attention), 4 layers, hidden 256, 8 heads / 4 KV heads, vocab 32,000: a
chunked prefill of one 512-token prompt in four chunks of 128 through a DynamicCache (model(input_ids=chunk,
cache=cache, use_cache=True, logits_to_keep=1), as a serving engine bounds a long prompt's activations), under
torch.inference_mode, with the allocator's expandable segments; the cache grows by torch.cat at every chunk. The
model is built on the device before the history is recorded (stacks="python"), so the weights predate the window;
the cache and the last chunk's next-token logits are held at the end."""

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

TORCH = "2.13"
SETTINGS = "expandable_segments:True"

CHUNK = 128


def main(cap):
    config = LlamaConfig(vocab_size=32000, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).to("cuda").eval()
    with cap.host():
        prompt = torch.randint(1, 32000, (1, 512))
    cap.record_memory_history(stacks="python", max_entries=100000)
    input_ids = prompt.to("cuda")
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        for start in range(0, input_ids.shape[1], CHUNK):
            chunk = input_ids[:, start:start + CHUNK]
            out = model(input_ids=chunk, cache=cache, use_cache=True, logits_to_keep=1)
            cache = out.cache
        next_logits = out.logits[:, -1, :].float()
    return model, cache, next_logits
