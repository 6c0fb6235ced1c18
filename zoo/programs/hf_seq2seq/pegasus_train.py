"""transformers PegasusForConditionalGeneration (a summarisation model: sinusoidal positions, pre-norm layers with
ReLU feed-forwards inline in the layer and a final LayerNorm on each stack, SDPA self-attention and decoder
cross-attention, an LM head tied to the shared embedding plus final_logits_bias), 2 encoder + 2 decoder layers,
d_model 256, 4 heads, FFN 1024, vocab 6,000, dropout 0.1, batch 8 with 160 document tokens and 48 summary tokens,
one training step with torch.optim.Adafactor (factored second moments: a row and a column vector per matrix).
The decoder inputs are made from the labels by the model's prepare_decoder_input_ids_from_labels (as
DataCollatorForSeq2Seq does) and the labels are passed too (the model's own cross-entropy). Recording starts
first: the model, built on the host, is moved with .to("cuda") inside the window, so the weights carry frames."""

import torch
from transformers import PegasusConfig, PegasusForConditionalGeneration

TORCH = "2.13"


def main(cap):
    config = PegasusConfig(vocab_size=6000, d_model=256, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                           decoder_attention_heads=4, encoder_ffn_dim=1024, decoder_ffn_dim=1024,
                           max_position_embeddings=512, activation_function="relu", dropout=0.1,
                           scale_embedding=True, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
                           forced_eos_token_id=1)
    with cap.host():
        model = PegasusForConditionalGeneration(config)
        input_ids = torch.randint(2, 6000, (8, 160))
        input_ids[:, -1] = 1                      # eos
        labels = torch.randint(2, 6000, (8, 48))
        labels[:, -1] = 1
    cap.record_memory_history(max_entries=200000)
    model.to("cuda")
    model.train()
    optimizer = torch.optim.Adafactor(model.parameters(), lr=1e-2)
    input_ids = input_ids.to("cuda")
    labels = labels.to("cuda")
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels=labels)
    out = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), decoder_input_ids=decoder_input_ids,
                labels=labels)
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer
