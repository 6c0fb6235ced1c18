"""torchvision.models.VisionTransformer, small: image 64, patch 16 (16 patches + a class token), 4 layers, 4 heads,
hidden 128, MLP 512, 1,000 classes; inference in eval mode under torch.inference_mode on a batch of 256 × 3 × 64
× 64, softmax over the classes and the top-1 class. The model is built directly on the device before recording
starts (its weights predate the window); a batch arrives from the host inside the window (stacks="python")."""

import torch
from torchvision.models import VisionTransformer

TORCH = "2.13"


def main(cap):
    model = VisionTransformer(image_size=64, patch_size=16, num_layers=4, num_heads=4, hidden_dim=128,
                              mlp_dim=512, num_classes=1000).to("cuda")
    model.eval()
    cap.record_memory_history(stacks="python", max_entries=100000)
    with cap.host():
        images = torch.randn(256, 3, 64, 64)
    images = images.to("cuda", non_blocking=True)
    with torch.inference_mode():
        logits = model(images)
        probs = torch.softmax(logits, dim=-1)
        pred = probs.argmax(dim=-1)
    return model, probs, pred
