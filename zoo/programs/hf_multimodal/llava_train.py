"""transformers LlavaForConditionalGeneration built from a LlavaConfig (a CLIP vision tower: 4 layers, hidden
256, 224 × 224 images in 14-pixel patches; the GELU projector; a Llama text model: 4 layers, hidden 256, GQA 8/4
heads, vocab 8,000), fine-tuned as in LLaVA's second stage: the vision tower frozen (requires_grad_(False)), the
projector and the language model trained with AdamW. Batch 3 images (pixel_values 3 × 3 × 224 × 224) with prompts
of 1 + 256 image tokens + 95 text tokens, labels -100 over the <bos>, the image tokens and the 31-token question,
the 64 answer tokens labelled (the model's own shifted cross-entropy over the full logits). One warm-up step, then
the history recorded for a second step: weights, AdamW moments and the gradients' storage from the first step
predate the window (zero_grad keeps .grad, zeroed in place)."""

import torch
from transformers import LlavaForConditionalGeneration

from zoo.programs.hf_multimodal import _llava

TORCH = "2.11"


def main(cap):
    with cap.host():
        model = LlavaForConditionalGeneration(_llava.config())
    model.to("cuda")
    model.model.vision_tower.requires_grad_(False)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-5, weight_decay=0.0)
    for step in range(2):
        if step == 1:
            cap.record_memory_history(max_entries=200000)
        with cap.host():
            input_ids = _llava.prompt(3, 95)
            pixel_values = _llava.images(3)
            labels = input_ids.clone()
            labels[:, : 1 + _llava.IMAGE_TOKENS + 31] = -100
        input_ids, labels = input_ids.to("cuda"), labels.to("cuda")
        pixel_values = pixel_values.to("cuda")
        out = model(input_ids=input_ids, pixel_values=pixel_values, attention_mask=torch.ones_like(input_ids),
                    labels=labels)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
    return model, optimizer
