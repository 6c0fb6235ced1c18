"""transformers BartForConditionalGeneration (learned positions, post-norm layers with GELU feed-forwards inline in
the layer, SDPA self-attention and decoder cross-attention, an LM head tied to the shared embedding plus
final_logits_bias), 2 encoder + 2 decoder layers, d_model 256, 4 heads, FFN 1024, vocab 8,000, dropout 0.1,
batch 4 with 192 source tokens and 64 target tokens (a denoising / summarisation step), AdamW training with the
labels passed to the model (it shifts them into decoder inputs and computes its own cross-entropy). A warm-up
step runs first; recording starts after it, so the weights and AdamW's moments predate the window and the
recorded step's gradients, activations and logits are made inside it."""

import torch
from transformers import BartConfig, BartForConditionalGeneration

TORCH = "2.11"


def main(cap):
    config = BartConfig(vocab_size=8000, d_model=256, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                        decoder_attention_heads=4, encoder_ffn_dim=1024, decoder_ffn_dim=1024,
                        max_position_embeddings=256, dropout=0.1, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                        decoder_start_token_id=2, forced_eos_token_id=2)
    model = BartForConditionalGeneration(config).to("cuda")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)

    def step():
        input_ids = torch.randint(3, 8000, (4, 192), device="cuda")
        input_ids[:, -1] = 2                      # eos
        labels = torch.randint(3, 8000, (4, 64), device="cuda")
        labels[:, -1] = 2
        out = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), labels=labels)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()                                        # warm-up: AdamW's moments exist before the window
    cap.record_memory_history(max_entries=200000)
    step()
    return model, optimizer
