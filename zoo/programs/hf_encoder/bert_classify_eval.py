"""transformers BertForSequenceClassification with attn_implementation="eager" (the attention scores
materialised by the matmul/softmax path), 4 layers, hidden 256, 8 heads, 3 labels, inference of one batch of 16 ×
128 tokens (padded, an attention mask) under torch.no_grad in eval mode; the argmax of the logits is copied back
to the host. The model is built on the host and moved to the device before recording starts (weights predate the
window); stacks="all"."""

import torch
from transformers import BertConfig, BertForSequenceClassification

TORCH = "2.11"


def main(cap):
    config = BertConfig(vocab_size=8000, hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                        intermediate_size=1024, max_position_embeddings=512, num_labels=3,
                        attn_implementation="eager")
    with cap.host():
        model = BertForSequenceClassification(config)
        input_ids = torch.randint(1000, 8000, (16, 128))
        lengths = torch.randint(48, 129, (16,))
        attention_mask = (torch.arange(128)[None, :] < lengths[:, None]).long()
        input_ids = input_ids * attention_mask
    model.to("cuda").eval()
    cap.record_memory_history(stacks="all")
    with torch.no_grad():
        logits = model(input_ids=input_ids.to("cuda"), attention_mask=attention_mask.to("cuda")).logits
        predictions = logits.argmax(dim=-1).cpu()
    return model, logits, predictions
