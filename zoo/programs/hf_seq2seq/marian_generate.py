"""transformers MarianMTModel generate() (a translation model: sinusoidal positions, post-norm layers with SiLU
feed-forwards inline in the layer, SDPA self-attention and decoder cross-attention over the encoder's output,
scaled embeddings shared by the encoder, the decoder and the LM head, plus final_logits_bias), 2 encoder + 2
decoder layers, d_model 256, 4 heads, FFN 1024, vocab 8,000: a batch of 2 source sentences × 96 tokens, beam
search with 4 beams (the encoder output expanded to 8 rows), 20 new tokens, the encoder-decoder KV cache (self-
attention keys/values grown per token, cross-attention keys/values computed once), under torch.inference_mode,
stacks="all". The model is built and moved to the device before recording starts."""

import torch
from transformers import MarianConfig, MarianMTModel

TORCH = "2.6"


def main(cap):
    config = MarianConfig(vocab_size=8000, decoder_vocab_size=8000, d_model=256, encoder_layers=2, decoder_layers=2,
                          encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=1024,
                          decoder_ffn_dim=1024, max_position_embeddings=512, activation_function="swish",
                          scale_embedding=True, pad_token_id=7999, decoder_start_token_id=7999, eos_token_id=0,
                          forced_eos_token_id=0)
    with cap.host():
        model = MarianMTModel(config)
    model.to("cuda").eval()
    model.generation_config.pad_token_id = 7999
    source = torch.randint(1, 7999, (2, 96), device="cuda")
    source[:, -1] = 0                             # eos
    cap.record_memory_history(stacks="all")
    with torch.inference_mode():
        model.generate(source, attention_mask=torch.ones_like(source), num_beams=4, max_new_tokens=20,
                       min_new_tokens=20, do_sample=False, early_stopping=True)
    return model
