"""The training data: a directory of class folders of images in memory, or WebDataset shards streamed.

`open_dataset` decides from `data_dir`: a `manifest.json` of a `shard` load there (or an `s3://`
prefix) means tar shards (shards.py); anything else is read as `<data_dir>/<class>/*.png`,
grey-scale, all in memory (digits: 1,797 images). Both give the same three things: `size`, `classes`,
`batches(epoch, rank, world, per_rank, steps)` (this rank's share of the epoch, equal on every rank) and
`eval_set(limit)` (images and labels for the probes).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DistributedSampler


class DataError(RuntimeError):
    """The data directory is missing, empty or holds images of different sizes."""


def open_dataset(data_dir: str, *, shuffle_buffer: int = 1000, seed: int = 0):
    """An ImageFolderDataset or a shards.ShardDataset, whichever `data_dir` holds."""
    import shards

    manifest = shards.read_manifest(data_dir)
    if shards.is_s3(data_dir) or (manifest is not None and manifest.get("mode") == "shard"):
        if manifest is None:
            raise DataError(f"{data_dir} has no {shards.MANIFEST}: give the partition's prefix")
        return shards.ShardDataset(data_dir, manifest, shuffle_buffer=shuffle_buffer, seed=seed)
    if manifest is None and any(Path(data_dir).glob("*.tar")):
        raise DataError(
            f"{data_dir} holds tar shards but no {shards.MANIFEST}: the payload reads the shards the "
            "partition's manifest lists (FSx shows it beside them; pcflow's stage-in copies it)"
        )
    return ImageFolderDataset(data_dir, seed=seed)


class ImageFolderDataset:
    """Every image in memory; each epoch a seeded permutation dealt out to the ranks (DistributedSampler)."""

    def __init__(self, data_dir: str, *, seed: int = 0):
        self.images, self.labels, self.classes = load_image_folder(data_dir)
        self.size, self.seed, self.source = len(self.images), seed, data_dir

    def batches(self, epoch: int, rank: int, world: int, per_rank: int, steps: int) -> Iterator[torch.Tensor]:
        sampler = DistributedSampler(
            range(self.size), num_replicas=world, rank=rank, shuffle=True, seed=self.seed, drop_last=True
        )
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler))
        for step in range(steps):
            yield self.images[order[step * per_rank : (step + 1) * per_rank]]

    def eval_set(self, limit: int) -> tuple[torch.Tensor, torch.Tensor]:
        """All images, or a seeded sample of `limit` of them."""
        if self.size <= limit:
            return self.images, self.labels
        chosen = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed))[:limit].sort().values
        return self.images[chosen], self.labels[chosen]


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
