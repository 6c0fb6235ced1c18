"""timm ConvNeXt-Atto (timm.create_model("convnext_atto"): depths 2-2-6-2, dims 40-80-160-320, depthwise 7×7
convs, LayerNorm2d, conv_mlp: a per-pixel MLP of 1×1 convs (timm Mlp, use_conv: conv-GELU-conv) with layer
scale), 100 classes, batch 16 × 3 × 96 × 96, SGD with momentum and Nesterov, cross-entropy. One warm-up step runs
first, then the history is recorded for a second step: the weights, the momentum buffers and the model (built on
the host, moved with .to("cuda")) predate the window; the gradients are set to None before each forward, so they
are all made inside it."""

import timm
import torch
import torch.nn.functional as F

TORCH = "2.6"


def main(cap):
    with cap.host():
        model = timm.create_model("convnext_atto", pretrained=False, num_classes=100)
    model.to("cuda")
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
    for step in range(2):
        if step == 1:
            cap.record_memory_history(stacks="python", max_entries=100000)
        with cap.host():
            images = torch.randn(16, 3, 96, 96)
            labels = torch.randint(0, 100, (16,))
        images, labels = images.to("cuda", non_blocking=True), labels.to("cuda", non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        logits = model(images)
        loss = F.cross_entropy(logits, labels)
        loss.backward()
        optimizer.step()
    return model, optimizer
