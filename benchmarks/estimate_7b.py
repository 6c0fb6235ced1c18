"""`snapanalyze estimate` at scale: a 7B-parameter decoder's training step (transformers' Llama at the Llama-2-7B
shape: 32 layers of d 4096, d_ff 11008, 32 heads, vocabulary 32,000; bf16 weights, AdamW, batch 8 × 4096 tokens,
SDPA attention, no KV cache, gradient checkpointing off) estimated with fake tensors on this machine. Prints the wall
time, the process's peak RSS and the estimate (must hold: under 60 s and 2 GiB RSS on the 2-core machine). Needs the zoo
extra's transformers."""

from __future__ import annotations

import argparse
import pickle
import resource
import sys
import time
from pathlib import Path


def step(batch: int, tokens: int, layers: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=layers, num_attention_heads=32,
                         num_key_value_heads=32, vocab_size=32000, max_position_embeddings=tokens,
                         attn_implementation="sdpa", use_cache=False)
    model = LlamaForCausalLM(config).to(torch.bfloat16).to("cuda")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(0, 32000, (batch, tokens), device="cuda")
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("-o", "--output", type=Path, default=None, help="Write the estimate's snapshot here.")
    args = parser.parse_args()
    from snapanalyze.collect import estimate
    from snapanalyze.units import fmt_bytes
    start = time.perf_counter()
    made = estimate.run(step, args.batch, args.tokens, args.layers, capacity=None,
                        shapes={"batch": args.batch, "tokens": args.tokens})
    took = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if args.output is not None:
        args.output.write_bytes(pickle.dumps(made.snapshot, protocol=4))
    print(f"7B training step, batch {args.batch} × {args.tokens}, {args.layers} layers: estimated in {took:.1f} s, "
          f"peak RSS {fmt_bytes(rss)}; peak active {fmt_bytes(made.peak_allocated)}, peak reserved "
          f"{fmt_bytes(made.peak_reserved)}")
    for line in made.choices:
        print(f"  {line}")
    return 0 if took < 60 and rss < 2 << 30 else 1


if __name__ == "__main__":
    sys.exit(main())
