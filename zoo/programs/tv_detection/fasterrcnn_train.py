"""torchvision Faster R-CNN with a MobileNetV3-Large FPN backbone (fasterrcnn_mobilenet_v3_large_fpn, weights=None,
weights_backbone=None: every backbone layer trainable, plain BatchNorm), 11 classes, its transform set to
min_size 256 / max_size 320 (no upscaling to 800 px); training mode on 2 images (240 × 320 and 256 × 256, batched
and padded by the model's GeneralizedRCNNTransform) with targets of 3 and 2 boxes: the RPN (anchors, objectness,
proposals with NMS, sampled objectness / box-regression losses), MultiScaleRoIAlign over the FPN levels, the
TwoMLPHead box head (fc6 → ReLU → fc7 over 512 sampled RoIs per image) and the FastRCNNPredictor, the model's
own loss dict summed, SGD with momentum 0.9 and weight decay, zero_grad after the forward (as torchvision's
detection reference engine does: the previous step's gradients live through the forward). Two steps: the history
(max_entries=200000) is recorded for the second only, so the weights, momentum buffers and first gradients predate
the window."""

import torch
from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_fpn

TORCH = "2.11"


def main(cap):
    with cap.host():
        model = fasterrcnn_mobilenet_v3_large_fpn(weights=None, weights_backbone=None, num_classes=11,
                                                  min_size=256, max_size=320)
    model.to("cuda")
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.02, momentum=0.9, weight_decay=1e-4)
    for step in range(2):
        if step == 1:
            cap.record_memory_history(max_entries=200000)
        with cap.host():
            images = [torch.rand(3, 240, 320), torch.rand(3, 256, 256)]
            targets = [
                {"boxes": torch.tensor([[10.0, 20.0, 120.0, 200.0], [150.0, 40.0, 300.0, 220.0],
                                        [60.0, 100.0, 180.0, 230.0]]),
                 "labels": torch.tensor([1, 4, 7])},
                {"boxes": torch.tensor([[30.0, 30.0, 200.0, 180.0], [100.0, 120.0, 250.0, 250.0]]),
                 "labels": torch.tensor([2, 10])},
            ]
        images = [image.to("cuda", non_blocking=True) for image in images]
        targets = [{k: v.to("cuda", non_blocking=True) for k, v in t.items()} for t in targets]
        loss_dict = model(images, targets)
        loss = sum(loss_dict.values())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model, optimizer
