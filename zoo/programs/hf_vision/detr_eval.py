"""transformers DetrForObjectDetection with attn_implementation="eager" (the attention scores and probabilities are
materialised) and a transformers-native ResNet backbone built from its config (use_timm_backbone=False,
use_pretrained_backbone=False: a ResNetBackbone of basic blocks, stem 32 channels, three stages 32/64/128 of one
block each, frozen batch norms; its stride-16 map, as in DETR-DC5, projected to d_model 128), sine position
embeddings, 2 encoder and 2 decoder layers (4 heads, ReLU feed-forwards of 512), 100 object queries, 91 classes;
inference in eval mode under torch.inference_mode. A DetrImageProcessor on the host resizes 4 images of different
sizes (shortest edge 320, longest 480), normalises them and pads them into one 4 × 3 × 426 × 479 batch with its
pixel_mask (27 × 30 = 810 encoder tokens per image, the padding masked out of the encoder's attention); then
DetrImageProcessor.post_process_object_detection on the device (softmax over the classes, boxes to corners scaled
to each image's size, a 0.5 threshold). The model is built on the host and moved to the device before recording
starts (its weights predate the window); the batch arrives inside it (stacks="all")."""

import numpy as np
import torch
from transformers import DetrConfig, DetrForObjectDetection, DetrImageProcessor, ResNetConfig

TORCH = "2.11"


def main(cap):
    backbone = ResNetConfig(embedding_size=32, hidden_sizes=[32, 64, 128], depths=[1, 1, 1], layer_type="basic",
                            out_features=["stage3"])
    config = DetrConfig(use_timm_backbone=False, use_pretrained_backbone=False, backbone_config=backbone,
                        d_model=128, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                        decoder_attention_heads=4, encoder_ffn_dim=512, decoder_ffn_dim=512, num_queries=100,
                        num_labels=91, attn_implementation="eager")
    processor = DetrImageProcessor(size={"shortest_edge": 320, "longest_edge": 480})
    with cap.host():
        model = DetrForObjectDetection(config)
    model.to("cuda")
    model.eval()
    cap.record_memory_history(stacks="all", max_entries=200000)
    rng = np.random.default_rng(0)
    sizes = ((480, 640), (640, 480), (375, 500), (427, 640))
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]
    with cap.host():
        batch = processor(images=images, return_tensors="pt")
    pixel_values = batch["pixel_values"].to("cuda", non_blocking=True)
    pixel_mask = batch["pixel_mask"].to("cuda", non_blocking=True)
    with torch.inference_mode():
        outputs = model(pixel_values=pixel_values, pixel_mask=pixel_mask)
        target_sizes = torch.tensor(sizes, device="cuda")
        results = processor.post_process_object_detection(outputs, threshold=0.5, target_sizes=target_sizes)
    return model, outputs, results
