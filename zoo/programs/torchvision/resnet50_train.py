"""torchvision ResNet-50, batch 8 × 3 × 96 × 96, SGD with momentum: two training steps, the history recorded for
the second only (weights and momentum buffers predate the window, with no frames)."""

import torch
import torch.nn.functional as F
from torchvision.models import resnet50

TORCH = "2.6"


def main(cap):
    model = resnet50(num_classes=100).to("cuda")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model.train()
    for step in range(2):
        if step == 1:
            cap.record_memory_history()
        with cap.host():
            images = torch.randn(8, 3, 96, 96)
            labels = torch.randint(0, 100, (8,))
        images, labels = images.to("cuda", non_blocking=True), labels.to("cuda", non_blocking=True)
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model, optimizer
