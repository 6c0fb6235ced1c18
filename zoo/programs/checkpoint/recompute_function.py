"""A small hand-written ViT-style classifier (Conv2d patch embedding 8 × 8, 64 tokens + a class token, d 256, 4 pre-norm
blocks of nn.MultiheadAttention and a memory-saving MLP, 100 classes), batch 32 × 3 × 64 × 64. Each block's MLP
(Linear 256 → 1,024 → GELU (tanh) → Linear 1,024 → 256, then Dropout 0.1) is a hand-written torch.autograd.Function
that saves only its input (and the weights) in the forward and recomputes the hidden pre-activation and the GELU in
its backward to form the gradients by hand. Adam, one training step. The model is built on the host and moved with
.to("cuda") before recording starts (its weights predate the window); recording (stacks="all") starts just before the
batch is moved to the device, so Adam's state and the gradients are made in it."""

import torch
import torch.nn as nn
import torch.nn.functional as F

TORCH = "2.11"


class RecomputedMLPFunction(torch.autograd.Function):
    """y = fc2(gelu(fc1(x))) keeping only x: the hidden activations are recomputed in the backward."""

    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2):
        ctx.save_for_backward(x, w1, b1, w2)
        return F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2)

    @staticmethod
    def backward(ctx, grad_out):
        x, w1, b1, w2 = ctx.saved_tensors
        h = F.linear(x, w1, b1)                          # recomputed pre-activation
        a = F.gelu(h, approximate="tanh")                # recomputed activation
        g2 = grad_out.reshape(-1, grad_out.shape[-1])
        grad_w2 = g2.t() @ a.reshape(-1, a.shape[-1])
        grad_b2 = g2.sum(0)
        grad_a = grad_out @ w2
        del a
        grad_h = torch.ops.aten.gelu_backward(grad_a, h, approximate="tanh")
        del grad_a, h
        gh = grad_h.reshape(-1, grad_h.shape[-1])
        grad_w1 = gh.t() @ x.reshape(-1, x.shape[-1])
        grad_b1 = gh.sum(0)
        grad_x = grad_h @ w1
        return grad_x, grad_w1, grad_b1, grad_w2, grad_b2


class MLP(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        y = RecomputedMLPFunction.apply(x, self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias)
        return self.drop(y)


class Block(nn.Module):
    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim, hidden)

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyViT(nn.Module):
    def __init__(self, image=64, patch=8, dim=256, depth=4, heads=8, hidden=1024, classes=100):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, heads, hidden) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, images):
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


def main(cap):
    with cap.host():
        model = TinyViT()
    model.to("cuda")
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with cap.host():
        images = torch.randn(32, 3, 64, 64)
        labels = torch.randint(0, 100, (32,))
    cap.record_memory_history(stacks="all")
    images, labels = images.to("cuda"), labels.to("cuda")
    loss = F.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer
