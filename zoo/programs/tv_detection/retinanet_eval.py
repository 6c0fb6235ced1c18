"""torchvision RetinaNet with a ResNet-50 FPN backbone (retinanet_resnet50_fpn, weights=None, weights_backbone=None:
plain BatchNorm, in eval mode; FPN levels P3–P5 plus the extra P6/P7 convs), 21 classes, 9 anchors per location,
its transform set to min_size 320 / max_size 448 and score_thresh 0.01; inference in eval mode under
torch.inference_mode on 2 images (320 × 416 as is, 288 × 384 resized to 320 × 426 by GeneralizedRCNNTransform,
normalised and padded into one 2 × 3 × 320 × 448 batch). The classification and box-regression heads (four 3 × 3
conv + ReLU layers each, shared over the levels) run on every level, then the postprocessing runs on the device:
sigmoid scores per level, score thresholding, the top 1,000 candidates per level, box decoding against the anchors,
clipping, batched NMS per class, the best 300 detections per image, boxes scaled back to the original image sizes.
The model is built on the host and moved to the device before recording starts (its weights and BatchNorm buffers
predate the window); the images arrive inside it (stacks="all")."""

import torch
from torchvision.models.detection import retinanet_resnet50_fpn

TORCH = "2.13"


def main(cap):
    with cap.host():
        model = retinanet_resnet50_fpn(weights=None, weights_backbone=None, num_classes=21, min_size=320,
                                       max_size=448, score_thresh=0.01)
    model.to("cuda")
    model.eval()
    cap.record_memory_history(stacks="all", max_entries=200000)
    with cap.host():
        images = [torch.rand(3, 320, 416), torch.rand(3, 288, 384)]
    images = [image.to("cuda", non_blocking=True) for image in images]
    with torch.inference_mode():
        detections = model(images)
    return model, detections
