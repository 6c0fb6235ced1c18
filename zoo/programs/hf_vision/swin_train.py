"""transformers SwinForImageClassification with attn_implementation="eager" (each window's attention scores and
probabilities, with the relative position bias and the shifted-window mask added, are materialised and saved for
the backward): image 64, patch 4 (16 × 16 tokens), window 4, two stages of 2 layers (embed 128 → 256 after the
patch merging, 4 → 8 heads, GELU MLPs of ratio 4), 100 classes, batch 16 × 3 × 64 × 64, trained with AdamW on the
model's own cross-entropy loss (labels passed to the model). The model is built directly on the device; one warm-up
step, then the history is recorded for a second step: the weights and AdamW's moments predate the window, the
first step's gradients are freed by zero_grad(set_to_none=True) before the second forward."""

import torch
from transformers import SwinConfig, SwinForImageClassification

TORCH = "2.11"


def main(cap):
    config = SwinConfig(image_size=64, patch_size=4, embed_dim=128, depths=[2, 2], num_heads=[4, 8], window_size=4,
                        mlp_ratio=4.0, drop_path_rate=0.1, num_labels=100, attn_implementation="eager")
    model = SwinForImageClassification(config).to("cuda")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    for step in range(2):
        if step == 1:
            cap.record_memory_history(max_entries=200000)
        with cap.host():
            images = torch.randn(16, 3, 64, 64)
            labels = torch.randint(0, 100, (16,))
        pixel_values, labels = images.to("cuda", non_blocking=True), labels.to("cuda", non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        out = model(pixel_values=pixel_values, labels=labels)
        out.loss.backward()
        optimizer.step()
    return model, optimizer
