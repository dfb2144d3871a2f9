"""SimCLR's two random views of each image, written with torch ops only (no torchvision).

One batched affine resample does crop, zoom, shift and rotation at once (`affine_grid` maps each
output pixel to a point of the input), then contrast/brightness jitter, a cut-out square and
Gaussian noise. No horizontal flip: a mirrored digit is another symbol. Every random number comes
from the generator passed in, so a (seed, epoch, rank) triple fixes the views exactly.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _uniform(n: int, low: float, high: float, generator: torch.Generator, device) -> torch.Tensor:
    return torch.rand(n, generator=generator, device=device) * (high - low) + low


def resize(images: torch.Tensor, size: int) -> torch.Tensor:
    """The deterministic view (evaluation, linear probe): the whole image resampled to size x size."""
    theta = torch.eye(2, 3, dtype=images.dtype, device=images.device).expand(images.shape[0], 2, 3)
    grid = F.affine_grid(theta, [images.shape[0], images.shape[1], size, size], align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def augment(
    images: torch.Tensor,
    size: int,
    generator: torch.Generator,
    *,
    crop: tuple[float, float] = (0.65, 1.0),
    max_shift: float = 0.2,
    max_degrees: float = 15.0,
    contrast: tuple[float, float] = (0.6, 1.4),
    max_brightness: float = 0.2,
    cutout_p: float = 0.5,
    cutout_frac: float = 0.3,
    noise_std: float = 0.05,
) -> torch.Tensor:
    """A random view of each image of (N, C, H, W) in [0, 1], as (N, C, size, size) in [0, 1]."""
    n, channels = images.shape[:2]
    dev = images.device
    scale = _uniform(n, *crop, generator, dev)  # < 1: a crop of that fraction of the side, zoomed in
    angle = _uniform(n, -max_degrees, max_degrees, generator, dev) * (math.pi / 180)
    shift = _uniform(2 * n, -max_shift, max_shift, generator, dev).view(n, 2)
    cos, sin = torch.cos(angle) * scale, torch.sin(angle) * scale
    theta = torch.stack([torch.stack([cos, -sin, shift[:, 0]], 1), torch.stack([sin, cos, shift[:, 1]], 1)], 1)
    grid = F.affine_grid(theta.to(images.dtype), [n, channels, size, size], align_corners=False)
    out = F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False)

    gain = _uniform(n, *contrast, generator, dev).view(n, 1, 1, 1)
    bias = _uniform(n, -max_brightness, max_brightness, generator, dev).view(n, 1, 1, 1)
    out = out * gain + bias

    # Cut-out: blank a random square in a random half of the views.
    side = max(1, round(size * cutout_frac))
    top = torch.randint(0, size - side + 1, (n, 1, 1), generator=generator, device=dev)
    left = torch.randint(0, size - side + 1, (n, 1, 1), generator=generator, device=dev)
    rows = torch.arange(size, device=dev).view(1, size, 1)
    cols = torch.arange(size, device=dev).view(1, 1, size)
    square = (rows >= top) & (rows < top + side) & (cols >= left) & (cols < left + side)
    apply = (torch.rand(n, 1, 1, generator=generator, device=dev) < cutout_p) & square
    out = out.masked_fill(apply.unsqueeze(1), 0.0)

    out = out + torch.randn(out.shape, generator=generator, device=dev, dtype=out.dtype) * noise_std
    return out.clamp_(0.0, 1.0)


def two_views(images: torch.Tensor, size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The positive pair of every image: two independent random views."""
    return augment(images, size, generator), augment(images, size, generator)
