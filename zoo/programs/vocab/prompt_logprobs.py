"""Prompt logprobs as a serving engine computes them (vLLM's echo / prompt_logprobs path): a transformers
LlamaForCausalLM in bfloat16 (SDPA attention, 2 layers, hidden 256, 8 heads / 2 KV heads, vocab 64,000, tied
embeddings) runs one prompt of 512 tokens under torch.inference_mode with logits_to_keep=0, so lm_head makes the
bf16 logits of every prompt position; a vLLM-style Sampler module then takes log_softmax(dim=-1,
dtype=float32) over the vocabulary, gathers each next prompt token's logprob, its rank (a count of the
vocabulary entries at least as likely) and the top-5 logprobs and token ids of every position. The model is built
on the host in bf16 and moved with .to("cuda") before the history is recorded (stacks="python"): the weights
predate the window; the prompt is copied to the device inside it."""

import torch
import torch.nn as nn
from transformers import LlamaConfig, LlamaForCausalLM

TORCH = "2.13"

VOCAB = 64000
TOP_K = 5


class Sampler(nn.Module):
    """The logprobs half of vLLM's Sampler: fp32 logprobs over the vocabulary, the chosen tokens' logprobs and
    ranks, and the top-k."""

    def compute_logprobs(self, logits):
        return logits.log_softmax(dim=-1, dtype=torch.float32)

    def gather_logprobs(self, logprobs, num_logprobs, token_ids):
        token_ids = token_ids.unsqueeze(-1)
        topk_logprobs, topk_indices = torch.topk(logprobs, num_logprobs, dim=-1)
        token_logprobs = logprobs.gather(-1, token_ids)
        token_ranks = (logprobs >= token_logprobs).sum(-1)
        indices = torch.cat((token_ids, topk_indices), dim=1)
        logprobs = torch.cat((token_logprobs, topk_logprobs), dim=1)
        return indices.to(torch.int32), logprobs, token_ranks

    def forward(self, logits, token_ids, num_logprobs):
        logprobs = self.compute_logprobs(logits)
        return self.gather_logprobs(logprobs, num_logprobs, token_ids)


def main(cap):
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=2048,
                         tie_word_embeddings=True)
    with cap.host():
        model = LlamaForCausalLM(config).to(torch.bfloat16)
        prompt = torch.randint(1, VOCAB, (1, 512))
    model.to("cuda").eval()
    sampler = Sampler()
    cap.record_memory_history(stacks="python", max_entries=100000)
    input_ids = prompt.to("cuda", non_blocking=True)
    with torch.inference_mode():
        out = model(input_ids=input_ids, use_cache=False, logits_to_keep=0)
        logits = out.logits[0, :-1]                    # position i predicts prompt token i + 1
        del out
        indices, logprobs, ranks = sampler(logits, input_ids[0, 1:], TOP_K)
        del logits
        result = (indices.cpu(), logprobs.cpu(), ranks.cpu())
    return model, result
