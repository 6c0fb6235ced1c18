"""transformers Mamba2ForCausalLM (Mamba-2 SSD mixers on the pure-PyTorch path: no mamba_ssm / causal_conv1d
kernels, so the prefill runs the chunked scan in torch ops and each decode step the single-token state update), 3
layers, hidden 256 (inner 512: 8 heads of 64, 1 group, state 64, chunks of 64 tokens), vocab 8,000, generate() on
a batch of 2 prompts × 256 tokens, greedy, 24 new tokens, with the model's cache (a DynamicCache holding each
layer's convolution and recurrent states, updated in place) under torch.inference_mode, stacks="all". The model is
built on the device before the history is recorded (weights predate the window); the prompt is made on the host
and copied to the device inside it."""

import torch
from transformers import Mamba2Config, Mamba2ForCausalLM

TORCH = "2.13"


def main(cap):
    config = Mamba2Config(vocab_size=8000, hidden_size=256, expand=2, num_heads=8, head_dim=64, n_groups=1,
                          state_size=64, chunk_size=64, num_hidden_layers=3, conv_kernel=4,
                          tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = Mamba2ForCausalLM(config).to("cuda").eval()
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    with cap.host():
        prompt = torch.randint(3, 8000, (2, 256))
    cap.record_memory_history(stacks="all")
    input_ids = prompt.to("cuda")
    with torch.inference_mode():
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=24,
                             min_new_tokens=24, do_sample=False)
    return model, out
