"""transformers MambaForCausalLM (selective-scan mixers on the pure-PyTorch path: no mamba_ssm / causal_conv1d
kernels, so the scan runs as the recurrent loop over the tokens), 3 layers, hidden 128 (inner 256, state 16),
vocab 4,000 (tied embeddings), batch 2 × 160 tokens, trained with AdamW on the model's own cross-entropy loss
(labels passed to the model). One warm-up step, then the history recorded for a second step: the weights and
AdamW's moments predate the window, the first step's gradients are freed by zero_grad(set_to_none=True)."""

import torch
from transformers import MambaConfig, MambaForCausalLM

TORCH = "2.11"


def main(cap):
    config = MambaConfig(vocab_size=4000, hidden_size=128, intermediate_size=256, state_size=16,
                         num_hidden_layers=3, conv_kernel=4, time_step_rank=8, use_cache=False)
    model = MambaForCausalLM(config).to("cuda")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    for step in range(2):
        if step == 1:
            cap.record_memory_history(max_entries=200000)
        with cap.host():
            batch = torch.randint(0, 4000, (2, 160))
        input_ids = batch.to("cuda")
        out = model(input_ids=input_ids, labels=input_ids)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model, optimizer
