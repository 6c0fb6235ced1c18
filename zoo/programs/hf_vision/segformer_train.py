"""transformers SegformerForSemanticSegmentation (a MiT-b0-like hierarchical encoder: 4 stages of 2 layers at
strides 4/8/16/32, hidden 32/64/160/256, 1/2/5/8 heads, efficient self-attention (SDPA) whose keys/values are
reduced by strided convolutions of ratio 8/4/2/1, Mix-FFNs fc1 → depth-wise 3×3 conv → GELU → fc2 of ratio 4; an
all-MLP decode head of 128 channels fusing the four stages upsampled to stride 4), 19 classes, batch 8 × 3 × 128 ×
128 with 128 × 128 label masks (an 8-row border of the ignore index 255), trained with SGD with momentum on the
model's own loss (the 32 × 32 logits upsampled bilinearly to the masks' size, cross-entropy). Recording starts
first: the model is built on the host and moved with .to("cuda") inside the window, so the weights, gradients and
momentum buffers are all recorded."""

import torch
from transformers import SegformerConfig, SegformerForSemanticSegmentation

TORCH = "2.13"


def main(cap):
    config = SegformerConfig(num_encoder_blocks=4, depths=[2, 2, 2, 2], hidden_sizes=[32, 64, 160, 256],
                             num_attention_heads=[1, 2, 5, 8], sr_ratios=[8, 4, 2, 1], mlp_ratios=[4, 4, 4, 4],
                             decoder_hidden_size=128, num_labels=19, drop_path_rate=0.1,
                             attn_implementation="sdpa")
    with cap.host():
        model = SegformerForSemanticSegmentation(config)
    cap.record_memory_history(max_entries=200000)
    model.to("cuda")
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    with cap.host():
        images = torch.randn(8, 3, 128, 128)
        masks = torch.randint(0, 19, (8, 128, 128))
        masks[:, :8, :] = 255                                   # an unlabelled border: the ignore index
    pixel_values, labels = images.to("cuda", non_blocking=True), masks.to("cuda", non_blocking=True)
    out = model(pixel_values=pixel_values, labels=labels)
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer
