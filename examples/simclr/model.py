"""A small conv encoder (the representation that is kept) and SimCLR's projection head (discarded).

GroupNorm instead of BatchNorm: no statistics to synchronise across DDP ranks and the same result
whatever the per-rank batch size.
"""

from __future__ import annotations

import torch
from torch import nn


def _block(cin: int, cout: int, stride: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
        nn.GroupNorm(min(8, cout), cout),
        nn.ReLU(inplace=True),
    )


class Encoder(nn.Module):
    """(N, 1, S, S) images in [0, 1] -> (N, 4 * width) features."""

    def __init__(self, width: int = 32, in_channels: int = 1) -> None:
        super().__init__()
        self.feature_dim = 4 * width
        self.body = nn.Sequential(
            _block(in_channels, width, 1),
            _block(width, 2 * width, 2),
            _block(2 * width, 2 * width, 1),
            _block(2 * width, 4 * width, 2),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.body(images * 2.0 - 1.0)


class SimCLR(nn.Module):
    """Encoder + 2-layer MLP projection head; forward gives the embeddings the loss compares."""

    def __init__(self, width: int = 32, embedding_dim: int = 64) -> None:
        super().__init__()
        self.encoder = Encoder(width)
        dim = self.encoder.feature_dim
        self.head = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(inplace=True), nn.Linear(dim, embedding_dim))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(images))
