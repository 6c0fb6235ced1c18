"""A hand-written MLP-Mixer image classifier (patch embedding by a strided Conv2d, 4 Mixer blocks each of a
token-mixing MLP 64 → 256 → 64 and a channel-mixing MLP 256 → 1,024 → 256 with GELU and LayerNorm, mean pooling,
a Linear head over 1,000 classes), batch 32 × 3 × 64 × 64 (8 × 8 patches), trained with
torch.optim.AdamW(fused=True, lr 1e-3, weight decay 0.05). The model and optimizer are made on the device before
the recording starts (max_entries 50,000); the window holds one training step, whose fused AdamW creates its
moments at the first step, then zero_grad(set_to_none=True)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

TORCH = "2.13"


class MlpBlock(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class MixerBlock(nn.Module):
    def __init__(self, num_tokens, dim, token_hidden, channel_hidden):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.token_mixing = MlpBlock(num_tokens, token_hidden)
        self.norm2 = nn.LayerNorm(dim)
        self.channel_mixing = MlpBlock(dim, channel_hidden)

    def forward(self, x):
        y = self.norm1(x).transpose(1, 2)
        x = x + self.token_mixing(y).transpose(1, 2)
        return x + self.channel_mixing(self.norm2(x))


class MlpMixer(nn.Module):
    def __init__(self, num_classes=1000, image_size=64, patch=8, dim=256, depth=4, token_hidden=256,
                 channel_hidden=1024):
        super().__init__()
        num_tokens = (image_size // patch) ** 2
        self.stem = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)
        self.blocks = nn.Sequential(*[MixerBlock(num_tokens, dim, token_hidden, channel_hidden)
                                      for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, images):
        x = self.stem(images).flatten(2).transpose(1, 2)
        x = self.norm(self.blocks(x))
        return self.head(x.mean(dim=1))


def main(cap):
    model = MlpMixer().to("cuda")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05, fused=True)
    model.train()
    cap.record_memory_history(max_entries=50000)
    with cap.host():
        images = torch.randn(32, 3, 64, 64)
        labels = torch.randint(0, 1000, (32,))
    images, labels = images.to("cuda", non_blocking=True), labels.to("cuda", non_blocking=True)
    loss = F.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer
