"""A hand-written residual MLP classifier (Linear stem 512 → 256, then an nn.Sequential of 6 pre-norm blocks —
LayerNorm → FeedForward (Linear 256 → 1,024 → GELU → Linear 1,024 → 256) → residual — then LayerNorm and a
Linear head over 100 classes), batch 2,048 × 512 features. The block stack runs through
torch.utils.checkpoint.checkpoint_sequential(blocks, 3, h, use_reentrant=True): 3 segments, each run under
no_grad in the forward and re-run by CheckpointFunction's backward. SGD with momentum 0.9, two training steps;
the history is recorded for the second only (stacks="python"), so the weights, the momentum buffers and the
.grad tensors (zero_grad(set_to_none=False) keeps them) predate the window."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint_sequential

TORCH = "2.6"


class FeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.ff = FeedForward(dim, hidden)

    def forward(self, x):
        return x + self.ff(self.norm(x))


class ResMLP(nn.Module):
    def __init__(self, in_dim, dim, hidden, depth, classes, segments):
        super().__init__()
        self.stem = nn.Linear(in_dim, dim)
        self.blocks = nn.Sequential(*[Block(dim, hidden) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)
        self.segments = segments

    def forward(self, x):
        h = self.stem(x)
        h = checkpoint_sequential(self.blocks, self.segments, h, use_reentrant=True)
        return self.head(self.norm(h))


def main(cap):
    with cap.host():
        model = ResMLP(in_dim=512, dim=256, hidden=1024, depth=6, classes=100, segments=3)
    model.to("cuda")
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for step in range(2):
        if step == 1:
            cap.record_memory_history(stacks="python")
        with cap.host():
            features = torch.randn(2048, 512)
            targets = torch.randint(0, 100, (2048,))
        features, targets = features.to("cuda"), targets.to("cuda")
        loss = F.cross_entropy(model(features), targets)
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        optimizer.step()
    return model, optimizer
