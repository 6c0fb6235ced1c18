"""transformers WhisperForConditionalGeneration from a small WhisperConfig (two stride-1/stride-2 Conv1d layers over
80 mel bins × 600 frames, max_source_positions 300; 4 encoder + 4 decoder layers, d_model 256, 4 heads, FFN 1,024,
SDPA attention, vocab 16,000, proj_out tied to the token embedding), trained on a batch of 4 log-mel feature maps
(input_features 4 × 80 × 600) with 48-token transcripts as labels (the model shifts them into decoder inputs
behind the start token and computes its own cross-entropy), AdamW, clip_grad_norm_ 1.0. One warm-up step with
zero_grad(set_to_none=True), then the history recorded for a second step: weights and AdamW moments predate the
window, the gradients are made again inside it; stacks="all"."""

import torch
from transformers import WhisperForConditionalGeneration

from zoo.programs.hf_speech import _whisper

TORCH = "2.13"


def main(cap):
    with cap.host():
        model = WhisperForConditionalGeneration(_whisper.config())
    model.to("cuda")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    for step in range(2):
        if step == 1:
            cap.record_memory_history(stacks="all", max_entries=100000)
        with cap.host():
            input_features = _whisper.features(4)
            labels = torch.randint(0, _whisper.EOT, (4, 48))
            labels[:, -1] = _whisper.EOT
        input_features = input_features.to("cuda", non_blocking=True)
        labels = labels.to("cuda", non_blocking=True)
        out = model(input_features=input_features, labels=labels)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model, optimizer
