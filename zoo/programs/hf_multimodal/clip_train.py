"""transformers CLIPModel (a ViT vision tower over 32-pixel patches and a causal text transformer, both 4 layers ×
hidden 256, 4 heads, QuickGELU MLPs, projections to 256) trained contrastively: a batch of 16 images (pixel_values
16 × 3 × 224 × 224, 7 × 7 patches + CLS) and 16 padded captions of 77 tokens (vocab 8,000, EOS-pooled), forward
with return_loss=True (the symmetric cross-entropy over the 16 × 16 image-text logits), one AdamW step. Recording
starts first and the model is then built directly on the device, so its weights carry their init frames; allocator
setting expandable_segments:True."""

import torch
from transformers import CLIPConfig, CLIPModel, CLIPTextConfig, CLIPVisionConfig

TORCH = "2.6"
SETTINGS = "expandable_segments:True"


def main(cap):
    cap.record_memory_history(max_entries=100000)
    text = CLIPTextConfig(vocab_size=8000, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                          num_attention_heads=4, max_position_embeddings=77, eos_token_id=2, bos_token_id=1,
                          pad_token_id=0)
    vision = CLIPVisionConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
                              image_size=224, patch_size=32)
    config = CLIPConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), projection_dim=256)
    model = CLIPModel(config).to("cuda")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.2)
    with cap.host():
        pixel_values = torch.randn(16, 3, 224, 224)
        input_ids = torch.randint(3, 8000, (16, 77))
        lengths = torch.randint(8, 77, (16,))
        positions = torch.arange(77)[None, :]
        input_ids[positions == lengths[:, None]] = 2                    # EOS ends each caption
        attention_mask = (positions <= lengths[:, None]).long()
        input_ids = input_ids * attention_mask
    out = model(input_ids=input_ids.to("cuda"), attention_mask=attention_mask.to("cuda"),
                pixel_values=pixel_values.to("cuda"), return_loss=True)
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer
