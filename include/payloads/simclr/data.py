"""The image dataset: `<data_dir>/<label>/*.png`, grey-scale, all in memory (digits: 1,797 images)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image


class DataError(RuntimeError):
    """The data directory is missing, empty or holds images of different sizes."""


def load_image_folder(root: str | Path) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Images as float (N, 1, H, W) in [0, 1], labels (N,) as class indices, and the class names.

    Classes are the sub-directories, sorted (numerically when they all are numbers); files are
    sorted by name, so the order (and everything seeded after it) is the same on every node.
    """
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"data_dir {root} is not a directory")
    classes = [p.name for p in root.iterdir() if p.is_dir()]
    classes.sort(key=lambda name: (0, int(name), "") if name.isdigit() else (1, 0, name))
    images, labels = [], []
    for index, name in enumerate(classes):
        for path in sorted((root / name).glob("*.png")):
            with Image.open(path) as image:
                images.append(np.asarray(image.convert("L"), dtype=np.uint8))
            labels.append(index)
    if not images:
        raise DataError(f"no PNG images in class folders under {root}")
    shapes = {image.shape for image in images}
    if len(shapes) != 1:
        raise DataError(f"images under {root} have different sizes: {sorted(shapes)}")
    pixels = torch.from_numpy(np.stack(images)).unsqueeze(1).float().div_(255.0)
    return pixels, torch.tensor(labels, dtype=torch.long), classes
