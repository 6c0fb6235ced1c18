"""Gradient accumulation while fine-tuning a transformers RobertaForSequenceClassification (SDPA attention),
4 layers, hidden 256, 4 heads, intermediate 1,024, vocab 8,000, 3 labels: four micro-batches of 4 × 192 tokens
(padded, with an attention mask), each loss divided by 4 and backpropagated into the accumulating .grad, then
AdamW.step (lr 2e-5, weight decay 0.01) and zero_grad(set_to_none=True). The model is built on the host and moved
with .to("cuda") before the recording starts (stacks="python"), so the weights predate the window; the
gradients (made by the first micro-batch's backward) and the AdamW moments (made at the step) are inside it.
The allocator runs with expandable_segments:True."""

import torch
from transformers import RobertaConfig, RobertaForSequenceClassification

TORCH = "2.6"
SETTINGS = "expandable_segments:True"

ACCUMULATION = 4


def main(cap):
    config = RobertaConfig(vocab_size=8000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                           intermediate_size=1024, max_position_embeddings=514, num_labels=3)
    with cap.host():
        model = RobertaForSequenceClassification(config)
        micro_batches = []
        for _ in range(ACCUMULATION):
            input_ids = torch.randint(3, 8000, (4, 192))
            lengths = torch.randint(96, 193, (4,))
            attention_mask = (torch.arange(192)[None, :] < lengths[:, None]).long()
            input_ids = input_ids.masked_fill(attention_mask == 0, config.pad_token_id)
            micro_batches.append((input_ids, attention_mask, torch.randint(0, 3, (4,))))
    model.to("cuda")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01)
    cap.record_memory_history(stacks="python")
    for input_ids, attention_mask, labels in micro_batches:
        batch = {"input_ids": input_ids.to("cuda", non_blocking=True),
                 "attention_mask": attention_mask.to("cuda", non_blocking=True),
                 "labels": labels.to("cuda", non_blocking=True)}
        out = model(**batch)
        loss = out.loss / ACCUMULATION
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer
