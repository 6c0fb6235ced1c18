"""A hand-written MLP regressor (Linear 64 → 512 → 512 → 1 with Tanh) fitted full-batch (4,096 points) with
torch.optim.LBFGS (history 8, strong-Wolfe line search): each ``step(closure)`` evaluates the closure — zero the
gradients, forward, MSE loss, backward — several times, and LBFGS keeps its own state beside the parameters (the
flattened gradient of the previous iterate, the direction, and up to eight pairs of flattened steps and gradient
differences). Three steps; the history is recorded for the third only (stacks="python"), so the weights and the
LBFGS history predate the window."""

import torch
import torch.nn as nn
import torch.nn.functional as F

TORCH = "2.6"


def main(cap):
    model = nn.Sequential(nn.Linear(64, 512), nn.Tanh(), nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 1)).cuda()
    optimizer = torch.optim.LBFGS(model.parameters(), lr=1.0, max_iter=4, history_size=8,
                                  line_search_fn="strong_wolfe")
    with cap.host():
        x = torch.randn(4096, 64)
        y = torch.sin(x[:, :8].sum(dim=1, keepdim=True))
    x, y = x.cuda(), y.cuda()

    def closure():
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        return loss

    for step in range(3):
        if step == 2:
            cap.record_memory_history(stacks="python")
        optimizer.step(closure)
    return model, optimizer
