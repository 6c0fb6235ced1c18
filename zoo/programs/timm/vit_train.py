"""timm VisionTransformer (timm.create_model("vit_tiny_patch16_224", img_size=96, depth=4): patch 16, embed 192,
3 heads, fused SDPA attention, GELU MLP, class token; 37 tokens), 100 classes, batch 16 × 3 × 96 × 96, one AdamW
training step with label-smoothing cross-entropy. Recording starts at the beginning: the model is built on the host
and moved with .to("cuda") inside the window, so weights, gradients and AdamW moments are all recorded."""

import timm
import torch
from timm.loss import LabelSmoothingCrossEntropy

TORCH = "2.13"


def main(cap):
    cap.record_memory_history(max_entries=200000)
    with cap.host():
        model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=96, depth=4,
                                  num_classes=100, drop_path_rate=0.1)
        images = torch.randn(16, 3, 96, 96)
        targets = torch.randint(0, 100, (16,))
    model.to("cuda")
    model.train()
    criterion = LabelSmoothingCrossEntropy(smoothing=0.1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.05)
    images, targets = images.to("cuda", non_blocking=True), targets.to("cuda", non_blocking=True)
    output = model(images)
    loss = criterion(output, targets)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return model, optimizer
