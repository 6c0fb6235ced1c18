"""A hand-written CNN classifier (four Conv2d → BatchNorm2d → ReLU stages with max-pooling, global average pooling,
a Linear head over 100 classes), batch 32 × 3 × 64 × 64, trained with SGD (momentum 0.9, Nesterov, weight decay
5e-4): two training steps, the history recorded for the second only with stacks="python" (weights, BatchNorm
buffers and the momentum buffers predate the window; the first step's gradients are zeroed to None before the
second backward)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

TORCH = "2.6"


class ConvBlock(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)), inplace=True)


class SmallCNN(nn.Module):
    def __init__(self, num_classes=100, widths=(32, 64, 128, 256)):
        super().__init__()
        layers, cin = [], 3
        for i, w in enumerate(widths):
            layers.append(ConvBlock(cin, w))
            layers.append(ConvBlock(w, w))
            if i < len(widths) - 1:
                layers.append(nn.MaxPool2d(2))
            cin = w
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.features(x)
        return self.classifier(torch.flatten(self.pool(x), 1))


def main(cap):
    model = SmallCNN(num_classes=100).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
    model.train()
    for step in range(2):
        if step == 1:
            cap.record_memory_history(stacks="python")
        with cap.host():
            images = torch.randn(32, 3, 64, 64)
            targets = torch.randint(0, 100, (32,))
        images, targets = images.cuda(non_blocking=True), targets.cuda(non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        logits = model(images)
        loss = F.cross_entropy(logits, targets, label_smoothing=0.1)
        loss.backward()
        optimizer.step()
    return model, optimizer
