"""A plain multilayer perceptron on tabular data (64 numeric features → 1,024 → 1,024 → 512 → 10 classes, ReLU and
dropout 0.1 between the Linear layers), trained with torch.optim.Adam (lr 1e-3) on a synthetic table of 32,768
rows that is moved to the device whole (a common pattern for small tabular sets) and sampled in shuffled
mini-batches of 2,048 rows. Four training steps; the history is recorded from the second step on (stacks="python",
max_entries 4,000), so the weights, the device-resident table, the gradients' first allocation and Adam's
moments predate the window."""

import torch
import torch.nn as nn
import torch.nn.functional as F

TORCH = "2.1"


class TabularMLP(nn.Module):
    def __init__(self, n_features=64, hidden=(1024, 1024, 512), n_classes=10, dropout=0.1):
        super().__init__()
        layers, width = [], n_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU(), nn.Dropout(dropout)]
            width = h
        self.body = nn.Sequential(*layers)
        self.out = nn.Linear(width, n_classes)

    def forward(self, x):
        return self.out(self.body(x))


def main(cap):
    with cap.host():
        features = torch.randn(32768, 64)
        weights = torch.randn(64, 10)
        labels = (features @ weights + 0.5 * torch.randn(32768, 10)).argmax(dim=1)
        features = (features - features.mean(0)) / features.std(0)
    X, y = features.to("cuda"), labels.to("cuda")
    model = TabularMLP().to("cuda")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    order = torch.randperm(X.shape[0], device="cuda")
    for step in range(4):
        if step == 1:
            cap.record_memory_history(max_entries=4000)
        idx = order[step * 2048:(step + 1) * 2048]
        logits = model(X[idx])
        loss = F.cross_entropy(logits, y[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model, optimizer, X, y
