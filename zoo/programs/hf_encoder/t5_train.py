"""transformers T5ForConditionalGeneration (T5 v1.0 layout: relative-position-bias attention that materialises
its scores, ReLU dense FFN, T5LayerNorm, an LM head tied to the shared embedding), 4 encoder + 4 decoder layers,
d_model 256, 4 heads × 64, d_ff 1024, vocab 16,000, dropout 0.1, batch 4 with 256 input tokens and 64 target
tokens, one AdamW training step with the labels passed to the model (it shifts them into decoder inputs and
computes its own cross-entropy). Recording starts first: the model, built on the host, is moved with
.to("cuda") inside the window, so the weights carry frames."""

import torch
from transformers import T5Config, T5ForConditionalGeneration

TORCH = "2.13"


def main(cap):
    config = T5Config(vocab_size=16000, d_model=256, d_kv=64, d_ff=1024, num_layers=4, num_decoder_layers=4,
                      num_heads=4, dropout_rate=0.1, feed_forward_proj="relu", decoder_start_token_id=0,
                      pad_token_id=0, eos_token_id=1)
    with cap.host():
        model = T5ForConditionalGeneration(config)
        input_ids = torch.randint(2, 16000, (4, 256))
        labels = torch.randint(2, 16000, (4, 64))
        labels[:, -1] = 1                         # eos
    cap.record_memory_history()
    model.to("cuda")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    input_ids = input_ids.to("cuda")
    labels = labels.to("cuda")
    out = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), labels=labels)
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer
