"""transformers HubertForSequenceClassification with attn_implementation="eager" (the attention scores and
probabilities are materialised), keyword spotting over 12 classes: a conv feature encoder of 5 layers (64
channels, kernels 10/3/3/3/2, strides 5/2/2/2/2, a layer norm after each; 80 samples per frame), feature
projection to hidden 256, a grouped, weight-normed positional conv embedding (kernel 32, 8 groups), 4 pre-norm
encoder layers (do_stable_layer_norm, as HuBERT-large: 4 heads, GELU feed-forwards of 1,024), the SUPERB head:
a softmax-weighted sum of the 5 hidden states (use_weighted_layer_sum, so every layer's output is kept until the
head), a projector to 128, a mean over the unpadded frames, a classifier to 12 classes. Inference in eval mode
under torch.inference_mode. A Wav2Vec2FeatureExtractor on the host normalises 4 random waveforms of 1.2–2 s at
16 kHz and pads them into one 4 × 32,000 batch with its attention_mask (400 frames, the padding masked out of the
attention); then a softmax over the classes and the top 3 on the device. The model is built on the host and
moved to the device before recording starts (its weights predate the window); the batch arrives inside it
(stacks="all")."""

import torch
from transformers import HubertConfig, HubertForSequenceClassification, Wav2Vec2FeatureExtractor

TORCH = "2.11"


def main(cap):
    config = HubertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
                          conv_dim=(64, 64, 64, 64, 64), conv_kernel=(10, 3, 3, 3, 2), conv_stride=(5, 2, 2, 2, 2),
                          num_conv_pos_embeddings=32, num_conv_pos_embedding_groups=8, feat_extract_norm="layer",
                          do_stable_layer_norm=True, use_weighted_layer_sum=True, classifier_proj_size=128,
                          num_labels=12, attn_implementation="eager")
    extractor = Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, padding_value=0.0, do_normalize=True,
                                         return_attention_mask=True)
    with cap.host():
        model = HubertForSequenceClassification(config)
    model.to("cuda")
    model.eval()
    cap.record_memory_history(stacks="all", max_entries=200000)
    with cap.host():
        lengths = (19200, 32000, 24000, 27200)
        waveforms = [torch.randn(n).numpy() for n in lengths]
        batch = extractor(waveforms, sampling_rate=16000, padding=True, return_tensors="pt")
    input_values = batch["input_values"].to("cuda", non_blocking=True)
    attention_mask = batch["attention_mask"].to("cuda", non_blocking=True)
    with torch.inference_mode():
        logits = model(input_values=input_values, attention_mask=attention_mask).logits
        probs = logits.softmax(dim=-1)
        top = probs.topk(3, dim=-1)
    return model, top
