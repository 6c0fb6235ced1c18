"""torchvision SSDlite320 with a MobileNetV3-Large backbone (ssdlite320_mobilenet_v3_large, weights=None,
weights_backbone=None: every layer trainable, BatchNorm with eps 0.001 / momentum 0.03; the backbone's features
taken at the expansion conv of its C4 block and after its last conv, plus four extra depthwise-separable blocks: six
feature maps of 20 × 20 down to 1 × 1, 6 default boxes per location, 3,234 in all), 21 classes; one training step on
2 images (300 × 300 and 280 × 320, both resized to 320 × 320 and scaled to [-1, 1] by the model's
GeneralizedRCNNTransform) with targets of 2 and 3 boxes: the SSDLite head's depthwise 3 × 3 + pointwise 1 × 1
classification and regression convs on every map, default-box matching, smooth-L1 box loss and cross-entropy with
3:1 hard negative mining (the model's own loss dict summed), Adam. The model is built on the host and moved with
.to("cuda") inside the window: the history (stacks="all") is recorded from the start, so the weights, gradients and
Adam's moment buffers are all recorded."""

import torch
from torchvision.models.detection import ssdlite320_mobilenet_v3_large

TORCH = "2.11"


def main(cap):
    cap.record_memory_history(stacks="all", max_entries=200000)
    with cap.host():
        model = ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=21)
        images = [torch.rand(3, 300, 300), torch.rand(3, 280, 320)]
        targets = [
            {"boxes": torch.tensor([[12.0, 20.0, 140.0, 210.0], [150.0, 60.0, 290.0, 280.0]]),
             "labels": torch.tensor([3, 15])},
            {"boxes": torch.tensor([[5.0, 5.0, 100.0, 90.0], [120.0, 40.0, 310.0, 200.0],
                                    [60.0, 150.0, 200.0, 270.0]]),
             "labels": torch.tensor([1, 7, 20])},
        ]
    model.to("cuda")
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=4e-5)
    images = [image.to("cuda", non_blocking=True) for image in images]
    targets = [{k: v.to("cuda", non_blocking=True) for k, v in t.items()} for t in targets]
    loss_dict = model(images, targets)
    loss = sum(loss_dict.values())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return model, optimizer
