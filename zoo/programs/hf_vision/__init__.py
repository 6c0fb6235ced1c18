"""transformers image models (ViT, Swin, SegFormer, DETR): training and inference."""
