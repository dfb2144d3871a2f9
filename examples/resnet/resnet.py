"""A bottleneck ResNet (He et al. 2016, the v1.5 variant: the stride on the 3x3 convolution) in plain torch.

`ResNet(depth=50, width=64)` is ResNet-50 (25.6 M parameters with 1,000 classes); `depth=14, width=8`
is a small one that trains on a CPU in seconds. The last BatchNorm of each block starts at zero, so
every block starts as the identity (Goyal et al. 2017).
"""

from __future__ import annotations

import torch
from torch import nn

#: Bottleneck blocks per stage for each depth (3 layers a block, plus the stem and the classifier).
BLOCKS = {14: (1, 1, 1, 1), 26: (2, 2, 2, 2), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}
EXPANSION = 4


def conv_bn(cin: int, cout: int, kernel: int, stride: int = 1) -> list[nn.Module]:
    """A bias-free convolution ('same' padding) and its BatchNorm."""
    return [nn.Conv2d(cin, cout, kernel, stride, padding=kernel // 2, bias=False), nn.BatchNorm2d(cout)]


class Bottleneck(nn.Module):
    """1x1 down to `mid` channels, 3x3 (with the stride), 1x1 up to 4 x mid; plus the shortcut."""

    def __init__(self, cin: int, mid: int, stride: int):
        super().__init__()
        cout = mid * EXPANSION
        self.body = nn.Sequential(
            *conv_bn(cin, mid, 1),
            nn.ReLU(inplace=True),
            *conv_bn(mid, mid, 3, stride),
            nn.ReLU(inplace=True),
            *conv_bn(mid, cout, 1),
        )
        nn.init.zeros_(self.body[-1].weight)
        self.shortcut = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(*conv_bn(cin, cout, 1, stride))
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The block's output: ReLU(body(x) + shortcut(x))."""
        return self.relu(self.body(x) + self.shortcut(x))


class ResNet(nn.Module):
    """Stem, four stages of bottleneck blocks (widths width x 1, 2, 4, 8), global pooling, a linear classifier."""

    def __init__(self, *, depth: int, width: int, num_classes: int, stem: str = "imagenet", in_channels: int = 3):
        super().__init__()
        if depth not in BLOCKS:
            raise ValueError(f"depth must be one of {sorted(BLOCKS)}, got {depth}")
        if stem == "imagenet":
            layers = [*conv_bn(in_channels, width, 7, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
        else:
            layers = [*conv_bn(in_channels, width, 3), nn.ReLU(inplace=True)]
        cin = width
        for stage, blocks in enumerate(BLOCKS[depth]):
            mid = width * 2**stage
            for i in range(blocks):
                layers.append(Bottleneck(cin, mid, stride=2 if stage > 0 and i == 0 else 1))
                cin = mid * EXPANSION
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.feature_dim = cin
        self.fc = nn.Linear(cin, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class scores (logits) for a batch of images."""
        return self.fc(self.features(x))


def build(hp, num_classes: int) -> ResNet:
    """The model the hyperparameters describe (what model.pt's `arch` rebuilds)."""
    return ResNet(depth=hp.depth, width=hp.width, num_classes=num_classes, stem=hp.stem)
