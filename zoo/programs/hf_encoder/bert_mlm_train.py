"""transformers BertForMaskedLM (SDPA self-attention with attention dropout 0, GELU intermediate, the MLM head's
transform and a decoder tied to the word embeddings), 4 layers, hidden 256, vocab 12,000, batch 8 × 128 tokens
with about 15 % of the positions masked and labelled (the rest -100), one AdamW training step with the labels
passed to the model (its own cross-entropy over the full logits) and clip_grad_norm_ 1.0. The model is built and
moved to the device before recording starts (the weights predate the window, with no frames); the AdamW state,
the gradients and the activations are made inside it."""

import torch
from transformers import BertConfig, BertForMaskedLM

TORCH = "2.6"

VOCAB, MASK_ID = 12000, 103


def main(cap):
    config = BertConfig(vocab_size=VOCAB, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                        intermediate_size=1024, max_position_embeddings=512, attention_probs_dropout_prob=0.0)
    with cap.host():
        model = BertForMaskedLM(config)
        input_ids = torch.randint(1000, VOCAB, (8, 128))
        masked = torch.rand(8, 128) < 0.15
        labels = torch.where(masked, input_ids, torch.full_like(input_ids, -100))
        input_ids = torch.where(masked, torch.full_like(input_ids, MASK_ID), input_ids)
        attention_mask = torch.ones_like(input_ids)
        token_type_ids = torch.zeros_like(input_ids)
    model.to("cuda")
    model.train()
    cap.record_memory_history(max_entries=100000)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.01)
    batch = {"input_ids": input_ids.to("cuda"), "attention_mask": attention_mask.to("cuda"),
             "token_type_ids": token_type_ids.to("cuda"), "labels": labels.to("cuda")}
    out = model(**batch)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer
