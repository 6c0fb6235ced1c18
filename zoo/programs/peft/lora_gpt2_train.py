"""peft LoRA (r 16, alpha 32, dropout 0.1, fan_in_fan_out for GPT-2's Conv1D) on the fused c_attn projection of a
transformers GPT2LMHeadModel (SDPA attention, attention dropout off), 4 layers, n_embd 256, 8 heads, vocab 8,000
(tied embeddings), batch 8 × 128 tokens, trained with torch.optim.SGD (momentum 0.9) over the LoRA parameters on
the model's own cross-entropy loss: one warm-up step, then the history recorded for a second step (stacks="all").
The frozen weights and the momentum buffers of the LoRA matrices predate the window; the model is built on the
device."""

import torch
from peft import LoraConfig, get_peft_model
from transformers import GPT2Config, GPT2LMHeadModel

TORCH = "2.6"


def main(cap):
    config = GPT2Config(vocab_size=8000, n_positions=256, n_embd=256, n_layer=4, n_head=8, attn_pdrop=0.0,
                        use_cache=False, bos_token_id=0, eos_token_id=0)
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.1, target_modules=["c_attn"], fan_in_fan_out=True,
                      task_type="CAUSAL_LM")
    model = get_peft_model(GPT2LMHeadModel(config), lora).to("cuda")
    model.train()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-2, momentum=0.9)
    for step in range(2):
        if step == 1:
            cap.record_memory_history(stacks="all", max_entries=100000)
        with cap.host():
            batch = torch.randint(0, 8000, (8, 128))
        input_ids = batch.to("cuda")
        out = model(input_ids=input_ids, labels=input_ids)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer
