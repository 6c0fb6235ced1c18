"""peft LoRA (r 8, alpha 16, dropout 0.05 on q_proj and v_proj) over a transformers LlamaForCausalLM (SDPA
attention, SwiGLU MLP), 4 layers, hidden 256, 8 heads / 4 KV heads, vocab 8,000, batch 4 × 256 tokens: one
training step with torch.optim.AdamW over the trainable (LoRA) parameters only, on the model's own cross-entropy
loss (labels passed), use_cache off. The base model is built on the host, wrapped by get_peft_model and moved with
.to("cuda") after the history starts recording (stacks="python"), so the frozen weights' copies are in the
window; AdamW's state covers only the LoRA A/B matrices."""

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

TORCH = "2.11"


def main(cap):
    config = LlamaConfig(vocab_size=8000, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512,
                         use_cache=False, tie_word_embeddings=False)
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules=["q_proj", "v_proj"],
                      task_type="CAUSAL_LM")
    with cap.host():
        model = get_peft_model(LlamaForCausalLM(config), lora)
        batch = torch.randint(0, 8000, (4, 256))
    cap.record_memory_history(stacks="python", max_entries=200000)
    model.to("cuda")
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)
    input_ids = batch.to("cuda")
    out = model(input_ids=input_ids, labels=input_ids)
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer
