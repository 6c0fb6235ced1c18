"""A hand-written CNN classifier (three Conv2d → BatchNorm2d → GELU stages with a stride-2 downsampling conv,
global average pooling, a Linear head over 10 classes), batch 64 × 3 × 32 × 32, trained with torch.optim.Adam
through ``optimizer.step(closure)``: the closure zeroes the gradients (to None), runs the forward and the backward
and returns the loss, so the whole step — forward, backward and the update — runs inside the optimizer's step.
Two steps; the history is recorded for the second only (stacks="python"): weights, BatchNorm buffers and the
Adam moments predate the window, the gradients are made afresh inside it."""

import torch
import torch.nn as nn
import torch.nn.functional as F

TORCH = "2.6"


class Stage(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.down = nn.Conv2d(cout, cout, 3, stride=2, padding=1)

    def forward(self, x):
        return self.down(F.gelu(self.bn(self.conv(x))))


class Net(nn.Module):
    def __init__(self, widths=(48, 96, 192), classes=10):
        super().__init__()
        cin, stages = 3, []
        for w in widths:
            stages.append(Stage(cin, w))
            cin = w
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(cin, classes)

    def forward(self, x):
        return self.head(self.stages(x).mean(dim=(2, 3)))


def main(cap):
    model = Net().cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(2):
        if step == 1:
            cap.record_memory_history(stacks="python")
        with cap.host():
            images = torch.randn(64, 3, 32, 32)
            targets = torch.randint(0, 10, (64,))
        images, targets = images.cuda(), targets.cuda()

        def closure(images=images, targets=targets):
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(images), targets)
            loss.backward()
            return loss

        optimizer.step(closure)
    return model, optimizer
