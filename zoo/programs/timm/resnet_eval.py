"""timm ResNet-18 (timm.create_model("resnet18"): BasicBlocks 2-2-2-2, BatchNorm, global average pool), 1,000
classes, inference in eval mode under torch.no_grad on a batch of 32 × 3 × 128 × 128, softmax and top-5 of the
outputs. The model is built on the device before recording starts (its weights and BatchNorm buffers predate the
window); the history, stacks="all", covers the batch's host-to-device copy and the forward."""

import timm
import torch

TORCH = "2.11"


def main(cap):
    model = timm.create_model("resnet18", pretrained=False, num_classes=1000).to("cuda")
    model.eval()
    with cap.host():
        images = torch.randn(32, 3, 128, 128)
    cap.record_memory_history(stacks="all", max_entries=100000)
    images = images.to("cuda", non_blocking=True)
    with torch.no_grad():
        logits = model(images)
        probs = logits.softmax(dim=-1)
        top5 = probs.topk(5, dim=-1)
    return model, probs, top5
