"""transformers LlavaForConditionalGeneration built from a LlavaConfig: a CLIP vision tower (CLIPVisionConfig:
4 layers, hidden 256, 224 × 224 images in 14-pixel patches, features from the second-to-last layer without the
CLS), the GELU multi-modal projector and a Llama text model (4 layers, hidden 256, GQA 8/4 heads, vocab 8,000).
generate() of 4 images (pixel_values 4 × 3 × 224 × 224) with prompts of 1 + 256 image tokens + 95 text tokens,
greedy, 8 new tokens, the dynamic KV cache (generate runs the vision tower and the projector once, before the
prefill). The model is built directly on the device before recording starts (weights predate the window);
max_entries=50000."""

import torch
from transformers import LlavaForConditionalGeneration

from zoo.programs.hf_multimodal import _llava

TORCH = "2.13"


def main(cap):
    model = LlavaForConditionalGeneration(_llava.config()).to("cuda").eval()
    model.generation_config.pad_token_id = 0
    with cap.host():
        input_ids = _llava.prompt(4, 95)
        pixel_values = _llava.images(4)
    cap.record_memory_history(max_entries=50000)
    input_ids = input_ids.to("cuda")
    pixel_values = pixel_values.to("cuda")
    output = model.generate(input_ids=input_ids, pixel_values=pixel_values, attention_mask=torch.ones_like(input_ids),
                            max_new_tokens=8, do_sample=False)
    return model, output
