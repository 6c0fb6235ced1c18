"""The small LLaVA both LLaVA programs build: a CLIP vision tower (224 × 224 images, 14-pixel patches: 256 patch
features after the CLS is dropped), the two-layer GELU projector and a Llama text model; prompts hold one image
token per patch feature."""

import torch
from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

VOCAB = 8000
IMAGE_TOKEN = VOCAB - 1
IMAGE_SIZE, PATCH = 224, 14
IMAGE_TOKENS = (IMAGE_SIZE // PATCH) ** 2


def config() -> LlavaConfig:
    vision = CLIPVisionConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
                              image_size=IMAGE_SIZE, patch_size=PATCH, projection_dim=256)
    text = LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                       num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024,
                       pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return LlavaConfig(vision_config=vision, text_config=text, image_token_index=IMAGE_TOKEN,
                       image_seq_length=IMAGE_TOKENS, vision_feature_select_strategy="default",
                       vision_feature_layer=-2, projector_hidden_act="gelu")


def prompt(batch: int, text_tokens: int) -> torch.Tensor:
    """<bos> <image>×64 then text: what LlavaProcessor makes of "<image>\\nUSER: … ASSISTANT:"."""
    bos = torch.ones(batch, 1, dtype=torch.long)
    image = torch.full((batch, IMAGE_TOKENS), IMAGE_TOKEN, dtype=torch.long)
    text = torch.randint(3, IMAGE_TOKEN, (batch, text_tokens))
    return torch.cat([bos, image, text], dim=1)


def images(batch: int) -> torch.Tensor:
    """CLIP-normalised pixel values."""
    return torch.randn(batch, 3, IMAGE_SIZE, IMAGE_SIZE)
