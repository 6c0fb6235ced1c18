"""transformers Wav2Vec2ForCTC (SDPA attention): a conv feature encoder of 4 layers (64 channels, kernels 10/3/3/2,
strides 5/2/2/2, a group norm after the first; 40 samples per frame), feature projection to hidden 256, a grouped,
weight-normed positional conv embedding (kernel 32, 8 groups), 3 post-norm encoder layers (4 heads, GELU feed-
forwards of 1,024, dropouts 0.1, no layer drop), SpecAugment time masking (probability 0.05, spans of 10 frames,
the masked frames replaced by the learned masked_spec_embed), a CTC head over a 32-character vocabulary (blank =
pad = 0). The feature encoder is frozen (model.freeze_feature_encoder()), so its convolutions keep nothing for the
backward. Batch 4 waveforms of 1.5 s at 16 kHz (4 × 24,000 samples, 600 frames), character labels of 40–60 tokens
padded with -100, trained with AdamW (over the parameters left trainable) on the model's own CTC loss (log-softmax
over the characters, then ctc_loss, mean reduction). The model is built directly on the device; one warm-up step,
then the history is recorded for a second step: the weights and AdamW's moments predate the window, the first
step's gradients are freed by zero_grad(set_to_none=True) before the second forward."""

import torch
from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

TORCH = "2.11"


def main(cap):
    config = Wav2Vec2Config(vocab_size=32, hidden_size=256, num_hidden_layers=3, num_attention_heads=4,
                            intermediate_size=1024, conv_dim=(64, 64, 64, 64), conv_kernel=(10, 3, 3, 2),
                            conv_stride=(5, 2, 2, 2), num_conv_pos_embeddings=32, num_conv_pos_embedding_groups=8,
                            feat_extract_norm="group", do_stable_layer_norm=False, layerdrop=0.0,
                            mask_time_prob=0.05, mask_time_length=10, pad_token_id=0, ctc_loss_reduction="mean",
                            ctc_zero_infinity=True)
    model = Wav2Vec2ForCTC(config).to("cuda")
    model.freeze_feature_encoder()
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, weight_decay=0.01)
    for step in range(2):
        if step == 1:
            cap.record_memory_history(max_entries=200000)
        with cap.host():
            waveforms = torch.randn(4, 24000)
            lengths = torch.randint(40, 61, (4,))
            labels = torch.randint(1, 32, (4, 60))
            labels[torch.arange(60)[None, :] >= lengths[:, None]] = -100
        input_values, labels = waveforms.to("cuda", non_blocking=True), labels.to("cuda", non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        out = model(input_values=input_values, labels=labels)
        out.loss.backward()
        optimizer.step()
    return model, optimizer
