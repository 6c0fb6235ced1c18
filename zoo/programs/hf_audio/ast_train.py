"""transformers ASTForAudioClassification (the Audio Spectrogram Transformer, SDPA attention) trained as an
AudioSet-style multi-label tagger: 128 mel bins × 200 frames of log-mel fbank features (2 s at 10 ms hops) cut
into 16 × 16 patches with strides 10 × 10 (12 × 19 = 228 patches, plus the CLS and distillation tokens), hidden
256, 4 layers (4 heads, GELU MLPs of 1,024), the mean of the two tokens through a LayerNorm + Linear head to 527
classes, the model's own BCE-with-logits loss against multi-hot labels (problem_type multi_label_classification).
An ASTFeatureExtractor on the host (numpy fbank: no torchaudio) turns 4 random 2 s waveforms at 16 kHz into the
batch 4 × 200 × 128. Two steps of SGD with momentum 0.9 (the momentum buffers appear in the first step). The model
is built on the host; recording starts first, then it is moved with .to("cuda")."""

import torch
from transformers import ASTConfig, ASTFeatureExtractor, ASTForAudioClassification

TORCH = "2.11"


def main(cap):
    config = ASTConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
                       patch_size=16, frequency_stride=10, time_stride=10, max_length=200, num_mel_bins=128,
                       num_labels=527, problem_type="multi_label_classification")
    extractor = ASTFeatureExtractor(num_mel_bins=128, max_length=200, sampling_rate=16000)
    with cap.host():
        model = ASTForAudioClassification(config)
    cap.record_memory_history(max_entries=200000)
    model.to("cuda")
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    for _ in range(2):
        with cap.host():
            waveforms = [torch.randn(32000).numpy() for _ in range(4)]
            features = extractor(waveforms, sampling_rate=16000, return_tensors="pt")["input_values"]
            labels = (torch.rand(4, 527) < 0.01).float()
        input_values, labels = features.to("cuda", non_blocking=True), labels.to("cuda", non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        out = model(input_values=input_values, labels=labels)
        out.loss.backward()
        optimizer.step()
    return model, optimizer
