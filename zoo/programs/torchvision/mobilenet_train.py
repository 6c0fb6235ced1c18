"""torchvision MobileNetV3-Small (inverted residuals with depthwise convs, squeeze-and-excitation, Hardswish,
BatchNorm, a Linear-Hardswish-Dropout-Linear classifier), 200 classes, batch 32 × 3 × 128 × 128, one training step
with RMSprop (momentum 0.9, as in the torchvision reference recipe) and label-smoothing cross-entropy. The model is
built on the host and moved with .to("cuda") inside the window; the history is recorded from the start, with
stacks="all", so weights, gradients and the RMSprop square-average and momentum buffers are all recorded."""

import torch
import torch.nn as nn
from torchvision.models import mobilenet_v3_small

TORCH = "2.11"


def main(cap):
    cap.record_memory_history(stacks="all", max_entries=200000)
    with cap.host():
        model = mobilenet_v3_small(num_classes=200)
        images = torch.randn(32, 3, 128, 128)
        labels = torch.randint(0, 200, (32,))
    model.to("cuda")
    model.train()
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    optimizer = torch.optim.RMSprop(model.parameters(), lr=0.064, alpha=0.9, eps=0.0316, momentum=0.9,
                                    weight_decay=1e-5)
    images, labels = images.to("cuda", non_blocking=True), labels.to("cuda", non_blocking=True)
    output = model(images)
    loss = criterion(output, labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return model, optimizer
