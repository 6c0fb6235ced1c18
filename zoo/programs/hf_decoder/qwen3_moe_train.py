"""transformers Qwen3MoeForCausalLM (SDPA attention with q/k norms, a sparse MoE block in every layer: a top-2 router
over 8 experts of intermediate 256), 3 layers, hidden 256, vocab 6,000, batch 4 × 256 tokens, one AdamW training
step with the labels passed to the model (its own cross-entropy loss plus the router's load-balancing loss). The
model is built on the device before the history is recorded (weights predate the window); AdamW's state and the
gradients are made inside it, stacks="all". The config keeps use_cache on (its default), so the forward also fills
a DynamicCache whose key/value tensors are the ones saved for the backward."""

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

TORCH = "2.13"


def main(cap):
    config = Qwen3MoeConfig(vocab_size=6000, hidden_size=256, intermediate_size=512, moe_intermediate_size=256,
                            num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=4, head_dim=32,
                            num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1, norm_topk_prob=True,
                            output_router_logits=True, router_aux_loss_coef=0.01, max_position_embeddings=512,
                            tie_word_embeddings=False)
    model = Qwen3MoeForCausalLM(config).to("cuda")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    with cap.host():
        batch = torch.randint(0, 6000, (4, 256))
    cap.record_memory_history(stacks="all", max_entries=200000)
    input_ids = batch.to("cuda")
    out = model(input_ids=input_ids, labels=input_ids)
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer
