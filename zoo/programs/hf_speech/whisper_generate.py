"""transformers WhisperForConditionalGeneration from a small WhisperConfig (80 mel bins × 600 frames,
max_source_positions 300; 4 encoder + 4 decoder layers, d_model 256, 4 heads, FFN 1,024, SDPA attention, vocab
16,000), Whisper's own generate() (short-form: the encoder run once by generate before the decoding loop, then the
decoder with its self-attention and cross-attention caches) on a batch of 8 log-mel feature maps (input_features
8 × 80 × 600), greedy, 16 new tokens, return_dict_in_generate with output_scores (the 16 processed per-step
logits kept), then the tokens' log-probabilities from the stacked scores; eval mode, torch.inference_mode. The
model is built on the host and moved to the device before recording starts (weights predate the window);
stacks="all"."""

import torch
from transformers import WhisperForConditionalGeneration

from zoo.programs.hf_speech import _whisper

TORCH = "2.11"


def main(cap):
    with cap.host():
        model = WhisperForConditionalGeneration(_whisper.config())
        input_features = _whisper.features(8)
    model.to("cuda").eval()
    cap.record_memory_history(stacks="all")
    with torch.inference_mode():
        out = model.generate(input_features.to("cuda"), max_new_tokens=16, do_sample=False,
                             return_dict_in_generate=True, output_scores=True)
        scores = torch.stack(out.scores, dim=1)                    # the per-step logits, for token confidences
        logprobs = scores.log_softmax(dim=-1).gather(-1, out.sequences[:, -scores.shape[1]:, None]).squeeze(-1)
    return model, out, logprobs
