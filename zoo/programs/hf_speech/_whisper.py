"""The small Whisper both speech programs build: 80 mel bins, 600 input frames (max_source_positions 300 after the
stride-2 convolution), d_model 256, 4 + 4 layers of 4 heads, FFN 1,024, a 16,000-token vocabulary with Whisper's
special tokens at its end, proj_out tied to the decoder's token embedding."""

import torch
from transformers import WhisperConfig

VOCAB = 16000
EOT, SOT, TRANSCRIBE, NO_TIMESTAMPS = 15995, 15996, 15997, 15998
FRAMES = 600


def config() -> WhisperConfig:
    return WhisperConfig(vocab_size=VOCAB, num_mel_bins=80, d_model=256, encoder_layers=4, decoder_layers=4,
                         encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=1024,
                         decoder_ffn_dim=1024, max_source_positions=FRAMES // 2, max_target_positions=128,
                         pad_token_id=EOT, bos_token_id=EOT, eos_token_id=EOT, decoder_start_token_id=SOT,
                         suppress_tokens=[], begin_suppress_tokens=[EOT], dropout=0.0)


def features(batch: int) -> torch.Tensor:
    """Log-mel features as WhisperFeatureExtractor makes them (scaled to about [-1, 1])."""
    return torch.randn(batch, 80, FRAMES).clamp(-1.5, 1.5) * 0.6
