"""A Growing Neural Cellular Automaton (Mordvintsev et al.) trained to grow a 64 × 64 RGBA target from a single
seed cell: 16 state channels; perception by a fixed depthwise 3 × 3 convolution (identity, Sobel x, Sobel y →
48 channels, circular padding); the update rule a per-cell MLP of 1 × 1 Conv2d 48 → 64 → ReLU → 1 × 1 Conv2d
64 → 16 (zero-initialised output); a stochastic update mask (each cell fires with probability 0.5) and alive
masking (3 × 3 max-pool of the alpha channel > 0.1 before and after the update). Batch 4 seeds, 32 rollout steps
per training step (every step's activations kept for the backward), MSE on the RGBA channels, per-parameter
gradient normalisation, Adam (lr 2e-3). The model and the target are on the device before the recording starts
(stacks="python"); the window holds one training step, Adam's moments created at its end."""

import torch
import torch.nn as nn
import torch.nn.functional as F

TORCH = "2.11"

CHANNELS, HIDDEN, SIZE, BATCH, STEPS = 16, 64, 64, 4, 32


class Perception(nn.Module):
    def __init__(self, channels):
        super().__init__()
        identity = torch.tensor([[0.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
        sobel_x = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]]) / 8.0
        kernel = torch.stack([identity, sobel_x, sobel_x.T])            # 3 filters per channel
        self.register_buffer("kernel", kernel.repeat(channels, 1, 1).unsqueeze(1))
        self.channels = channels

    def forward(self, x):
        x = F.pad(x, (1, 1, 1, 1), mode="circular")
        return F.conv2d(x, self.kernel, groups=self.channels)


class UpdateNet(nn.Module):
    def __init__(self, channels, hidden):
        super().__init__()
        self.conv1 = nn.Conv2d(3 * channels, hidden, 1)
        self.conv2 = nn.Conv2d(hidden, channels, 1, bias=False)
        nn.init.zeros_(self.conv2.weight)

    def forward(self, p):
        return self.conv2(F.relu(self.conv1(p)))


class CellularAutomaton(nn.Module):
    def __init__(self, channels=CHANNELS, hidden=HIDDEN, fire_rate=0.5):
        super().__init__()
        self.perceive = Perception(channels)
        self.update_net = UpdateNet(channels, hidden)
        self.fire_rate = fire_rate

    @staticmethod
    def alive(x):
        return F.max_pool2d(x[:, 3:4], kernel_size=3, stride=1, padding=1) > 0.1

    def forward(self, x):
        pre_alive = self.alive(x)
        dx = self.update_net(self.perceive(x))
        fire = (torch.rand(x.shape[0], 1, x.shape[2], x.shape[3], device=x.device) <= self.fire_rate).float()
        x = x + dx * fire
        post_alive = self.alive(x)
        return x * (pre_alive & post_alive).float()


def make_target(size):
    """A soft RGBA disc with a coloured gradient (a stand-in for the emoji the paper grows)."""
    ys, xs = torch.meshgrid(torch.linspace(-1, 1, size), torch.linspace(-1, 1, size), indexing="ij")
    alpha = torch.sigmoid((0.6 - (xs ** 2 + ys ** 2).sqrt()) * 20)
    rgb = torch.stack([(xs + 1) / 2, (ys + 1) / 2, 1 - (xs + 1) / 2]) * alpha
    return torch.cat([rgb, alpha[None]])[None]


def main(cap):
    with cap.host():
        target = make_target(SIZE)
    target = target.to("cuda")
    ca = CellularAutomaton().to("cuda")
    optimizer = torch.optim.Adam(ca.parameters(), lr=2e-3)
    cap.record_memory_history(stacks="python")
    seed = torch.zeros(BATCH, CHANNELS, SIZE, SIZE, device="cuda")
    seed[:, 3:, SIZE // 2, SIZE // 2] = 1.0
    x = seed
    for _ in range(STEPS):
        x = ca(x)
    loss = F.mse_loss(x[:, :4], target.expand(BATCH, -1, -1, -1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    with torch.no_grad():
        for p in ca.parameters():
            p.grad /= p.grad.norm() + 1e-8
    optimizer.step()
    return ca, optimizer, x.detach()
