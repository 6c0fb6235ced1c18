"""diffusers AutoencoderKL, tiny: block_out_channels (32, 64, 64), one layer per block, GroupNorm groups 16,
4 latent channels, a mid block with self-attention; decoding a batch of 4 latents of 4 × 32 × 32 (scaled by
1/scaling_factor) into 4 × 3 × 128 × 128 images under torch.no_grad, then clamped to [0, 1] and moved to the host
as a pipeline does. The VAE is built on the host and moved with .to("cuda") before recording starts, so its
weights predate the window; the latents are made on the device inside it."""

import torch
from diffusers import AutoencoderKL

TORCH = "2.6"


def main(cap):
    with cap.host():
        vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(32, 64, 64),
                            down_block_types=("DownEncoderBlock2D",) * 3, up_block_types=("UpDecoderBlock2D",) * 3,
                            layers_per_block=1, norm_num_groups=16, sample_size=128)
    vae.to("cuda").eval()
    cap.record_memory_history(stacks="python")
    latents = torch.randn(4, 4, 32, 32, device="cuda")
    with torch.no_grad():
        image = vae.decode(latents / vae.config.scaling_factor, return_dict=False)[0]
        image = (image / 2 + 0.5).clamp(0, 1)
    images = image.cpu().permute(0, 2, 3, 1).float().numpy()
    return vae, image, images
