"""The few CNNs the project defines itself (transformers has no VGG, AlexNet or LeNet).

Each is an `nn.Sequential` of named layers, so the decomposition is simply its children: one conv
(+ ReLU, + pooling when a pool follows) is one layer, one fully connected layer (+ ReLU, dropout)
is one layer. Shapes follow torchvision's definitions, which we cannot import beside the CPU
torch build (see README), so they are written out here.
"""

from __future__ import annotations

import random
from collections import OrderedDict

from torch import nn

# torchvision.models.vgg cfgs "D" (VGG-16) and "E" (VGG-19); "M" is a 2x2 max-pool.
VGG_CONFIGS = {
    16: [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
    19: [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M"],
}


def _conv_layers(config: list, in_channels: int, width_divisor: int) -> list[tuple[str, nn.Module]]:
    layers: list[tuple[str, nn.Module]] = []
    for item in config:
        if item == "M":
            # The pool belongs to the conv before it: no pipeline cut between a conv and its pool.
            name, block = layers[-1]
            layers[-1] = (name, nn.Sequential(*block, nn.MaxPool2d(kernel_size=2, stride=2)))
            continue
        out_channels = max(1, item // width_divisor)
        conv = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1)
        layers.append((f"conv{len(layers) + 1}", nn.Sequential(conv, nn.ReLU(inplace=True))))
        in_channels = out_channels
    return layers


def vgg(depth: int, num_classes: int = 1000, width_divisor: int = 1) -> nn.Sequential:
    """VGG-16/19 as torchvision builds it (adaptive 7x7 pool, 4096-4096 classifier with dropout)."""
    layers = _conv_layers(VGG_CONFIGS[depth], 3, width_divisor)
    channels = 512 // width_divisor
    hidden = 4096 // width_divisor
    layers.append(("pool_fc1", nn.Sequential(
        nn.AdaptiveAvgPool2d((7, 7)), nn.Flatten(), nn.Linear(channels * 49, hidden), nn.ReLU(inplace=True),
        nn.Dropout(0.5))))
    layers.append(("fc2", nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(inplace=True), nn.Dropout(0.5))))
    layers.append(("fc3", nn.Linear(hidden, num_classes)))
    return nn.Sequential(OrderedDict(layers))


def alexnet(num_classes: int = 1000, width_divisor: int = 1) -> nn.Sequential:
    """AlexNet as torchvision.models.alexnet builds it (61.1M parameters at 1000 classes)."""
    c = [64, 192, 384, 256, 256]
    c = [max(1, x // width_divisor) for x in c]
    hidden = 4096 // width_divisor
    relu = lambda: nn.ReLU(inplace=True)  # noqa: E731
    pool = lambda: nn.MaxPool2d(kernel_size=3, stride=2)  # noqa: E731
    return nn.Sequential(OrderedDict([
        ("conv1", nn.Sequential(nn.Conv2d(3, c[0], kernel_size=11, stride=4, padding=2), relu(), pool())),
        ("conv2", nn.Sequential(nn.Conv2d(c[0], c[1], kernel_size=5, padding=2), relu(), pool())),
        ("conv3", nn.Sequential(nn.Conv2d(c[1], c[2], kernel_size=3, padding=1), relu())),
        ("conv4", nn.Sequential(nn.Conv2d(c[2], c[3], kernel_size=3, padding=1), relu())),
        ("conv5", nn.Sequential(nn.Conv2d(c[3], c[4], kernel_size=3, padding=1), relu(), pool())),
        ("pool_fc1", nn.Sequential(nn.AdaptiveAvgPool2d((6, 6)), nn.Flatten(), nn.Dropout(0.5),
                                   nn.Linear(c[4] * 36, hidden), relu())),
        ("fc2", nn.Sequential(nn.Dropout(0.5), nn.Linear(hidden, hidden), relu())),
        ("fc3", nn.Linear(hidden, num_classes)),
    ]))


def lenet5(num_classes: int = 10) -> nn.Sequential:
    """LeNet-5 (LeCun et al. 1998) on 1x32x32 inputs: 61,706 parameters at 10 classes."""
    return nn.Sequential(OrderedDict([
        ("conv1", nn.Sequential(nn.Conv2d(1, 6, kernel_size=5), nn.Tanh(), nn.AvgPool2d(2))),
        ("conv2", nn.Sequential(nn.Conv2d(6, 16, kernel_size=5), nn.Tanh(), nn.AvgPool2d(2))),
        ("fc1", nn.Sequential(nn.Flatten(), nn.Linear(16 * 5 * 5, 120), nn.Tanh())),
        ("fc2", nn.Sequential(nn.Linear(120, 84), nn.Tanh())),
        ("fc3", nn.Linear(84, num_classes)),
    ]))


def csimd_cnn(n_layers: int, image_size: int = 100, num_classes: int = 10, seed: int = 0) -> nn.Sequential:
    """CSIMD Table III: K-1 3x3 conv layers with U(20, 50) output channels, then one FC layer.

    The paper gives only channels and kernel; we use padding 1 and ReLU (shape-preserving, so the
    FC input is C_{K-1} x 100 x 100), and a seeded generator so that "csimd-cnn-12" is one model.
    """
    if n_layers < 2:
        raise ValueError("the CSIMD CNN needs at least 2 layers (one conv, one FC)")
    rng = random.Random(seed)
    layers: list[tuple[str, nn.Module]] = []
    in_channels = 1
    for i in range(n_layers - 1):
        out_channels = rng.randint(20, 50)  # U(20, 50), Table III
        layers.append((f"conv{i + 1}", nn.Sequential(
            nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1), nn.ReLU(inplace=True))))
        in_channels = out_channels
    layers.append(("fc", nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size * image_size, num_classes))))
    return nn.Sequential(OrderedDict(layers))
