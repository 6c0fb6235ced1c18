"""diffusers UNet2DConditionModel, tiny: block_out_channels (32, 64), two layers per block, down blocks
CrossAttnDownBlock2D + DownBlock2D, mid UNetMidBlock2DCrossAttn, up blocks UpBlock2D + CrossAttnUpBlock2D, GroupNorm
groups 16, attention head dim 8, cross-attention (dim 64) to a random "text" embedding of 77 tokens; 4-channel
latents of 32 × 32, batch 4. One DDPM noise-prediction training step: DDPMScheduler (1,000 steps) add_noise at
random timesteps, MSE between the predicted and the true noise, AdamW. The model is built on the host; recording
starts before .to("cuda"), so weights, gradients and AdamW moments are all in the window. The allocator runs with
expandable_segments:True (PYTORCH_CUDA_ALLOC_CONF), as diffusion training scripts often set."""

import torch
import torch.nn.functional as F
from diffusers import DDPMScheduler, UNet2DConditionModel

TORCH = "2.13"
SETTINGS = "expandable_segments:True"


def main(cap):
    with cap.host():
        unet = UNet2DConditionModel(
            sample_size=32, in_channels=4, out_channels=4, layers_per_block=2, block_out_channels=(32, 64),
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
            cross_attention_dim=64, attention_head_dim=8, norm_num_groups=16)
        scheduler = DDPMScheduler(num_train_timesteps=1000)
        latents = torch.randn(4, 4, 32, 32)
        text_embeddings = torch.randn(4, 77, 64)
    cap.record_memory_history(max_entries=200000)
    unet.to("cuda")
    unet.train()
    optimizer = torch.optim.AdamW(unet.parameters(), lr=1e-4, weight_decay=1e-2)
    latents = latents.to("cuda")
    encoder_hidden_states = text_embeddings.to("cuda")
    noise = torch.randn_like(latents)
    timesteps = torch.randint(0, scheduler.config.num_train_timesteps, (latents.shape[0],), device=latents.device)
    noisy_latents = scheduler.add_noise(latents, noise, timesteps)
    model_pred = unet(noisy_latents, timesteps, encoder_hidden_states, return_dict=False)[0]
    loss = F.mse_loss(model_pred.float(), noise.float(), reduction="mean")
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return unet, optimizer
