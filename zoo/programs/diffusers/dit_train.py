"""diffusers DiTTransformer2DModel, tiny: 4 layers, 4 heads × 32 (hidden 128), patch 2 on 4-channel 16 × 16
latents (64 tokens), adaLN-Zero norms conditioned on the timestep and a class label (a 1,000-class table, labels
drawn from 100), GELU (tanh) MLP, learned-sigma output (8 channels); batch 16. One training step of
class-conditional diffusion: DDPMScheduler add_noise at random timesteps, MSE on the predicted noise (the first 4
output channels), AdamW with gradient clipping. The model is built directly on the device and one warm-up step
runs first; the history is recorded for the second step, so the weights and the AdamW moments predate the
window."""

import torch
import torch.nn.functional as F
from diffusers import DDPMScheduler, DiTTransformer2DModel

TORCH = "2.11"


def main(cap):
    model = DiTTransformer2DModel(num_attention_heads=4, attention_head_dim=32, in_channels=4, out_channels=8,
                                  num_layers=4, sample_size=16, patch_size=2, num_embeds_ada_norm=1000)
    model = model.to("cuda")
    model.train()
    scheduler = DDPMScheduler(num_train_timesteps=1000)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    for step in range(2):
        if step == 1:
            cap.record_memory_history(max_entries=100000)
        with cap.host():
            latents = torch.randn(16, 4, 16, 16)
            class_labels = torch.randint(0, 100, (16,))
        latents, class_labels = latents.to("cuda"), class_labels.to("cuda")
        noise = torch.randn_like(latents)
        timesteps = torch.randint(0, scheduler.config.num_train_timesteps, (latents.shape[0],), device="cuda")
        noisy = scheduler.add_noise(latents, noise, timesteps)
        out = model(noisy, timestep=timesteps, class_labels=class_labels, return_dict=False)[0]
        noise_pred, _ = out.chunk(2, dim=1)
        loss = F.mse_loss(noise_pred, noise)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    return model, optimizer
