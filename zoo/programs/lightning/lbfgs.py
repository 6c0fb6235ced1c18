"""A small MLP regression (torch.nn.Sequential: Linear 64 → 256, Tanh, two Linear 256 → 256 with Tanh, Linear
256 → 1; 148,481 parameters) fitted full-batch to 4,096 host-made samples (a smooth random target) with
torch.optim.LBFGS (history_size 20, max_iter 10, strong-Wolfe line search): 3 optimizer.step(closure) calls, the
closure zeroing the gradients, computing the MSE loss and running backward, so each step runs many forward/backward
passes and keeps LBFGS's flat-vector history (old_dirs, old_stps, d, prev_flat_grad) in its state. The model is
built on the host and moved with .to("cuda"); the data are moved with .to("cuda"). Recording starts (default
stacks) after the data and the model are on the device, so weights and data predate the window."""

import torch
from torch import nn

TORCH = "2.6"


def main(cap):
    with cap.host():
        x = torch.rand(4096, 64) * 2 - 1
        w = torch.randn(64, 8) / 8
        y = torch.sin(3 * x @ w).sum(dim=1, keepdim=True)
        model = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(),
                              nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 1))
    model = model.to("cuda")
    x, y = x.to("cuda"), y.to("cuda")
    cap.record_memory_history()
    optimizer = torch.optim.LBFGS(model.parameters(), lr=1, history_size=20, max_iter=10,
                                  line_search_fn="strong_wolfe")
    loss_fn = nn.MSELoss()

    def closure():
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        return loss

    losses = []
    for _ in range(3):
        losses.append(optimizer.step(closure).item())
    return model, optimizer
