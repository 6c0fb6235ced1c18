"""Sampling over a large vocabulary: a transformers LlamaForCausalLM (SDPA attention, 2 layers, hidden 256, 8
heads / 2 KV heads, vocab 64,000, tied embeddings, fp32) runs generate() on a batch of 16 prompts × 32 tokens with
do_sample, temperature 0.7, top_p 0.9 (top_k off) and a repetition penalty of 1.1 — transformers' logits
processors: the penalty's gather/scatter over the prompt tokens, the temperature division, top-p's full-vocabulary
sort, softmax, cumsum and scatter back — then softmax and multinomial, for 4 new tokens with the dynamic KV cache
under torch.no_grad. The model is built directly on the device before the history is recorded (stacks="all"), so
the weights predate the window; the prompts are a host batch copied in inside it."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

TORCH = "2.11"

VOCAB = 64000


def main(cap):
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(config).to("cuda").eval()
    cap.record_memory_history(stacks="all", max_entries=200000)
    with cap.host():
        prompts = torch.randint(3, VOCAB, (16, 32))
    input_ids = prompts.to("cuda")
    attention_mask = torch.ones_like(input_ids)
    with torch.no_grad():
        out = model.generate(input_ids, attention_mask=attention_mask, do_sample=True, temperature=0.7, top_p=0.9,
                             top_k=0, repetition_penalty=1.1, max_new_tokens=4, min_new_tokens=4)
    return model, out
