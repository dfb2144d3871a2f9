"""Images and labels from WebDataset tar shards: what pcflow's `dataset.mode: shard` writes.

`data_dir` holds the partition's `manifest.json` and the shards it lists (on ParallelCluster the FSx
mount of the partition, on a static cluster pcflow's stage-in copy). A sample is `<class>/<name>.<image>`
plus `<class>/<name>.cls`, the class's index in the manifest's `classes`. Nothing is unpacked: each
shard is read as one stream by webdataset's tar iterator.

Every sample belongs to the training or the held-out split by a hash of its key (`val_fraction`), so the
split is the same on every node and every run whatever the shard layout. Each reader (one per process and
loader worker: a "lane") reads its own shards, or, when there are fewer shards than lanes, every
shard and every lanes-th sample of it. Training lanes cycle through their shards in a seeded order
(each epoch another) through a shuffle buffer, so every process takes the same number of steps.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import IterableDataset, get_worker_info
from webdataset.tariterators import group_by_keys, tar_file_expander

MANIFEST = "manifest.json"
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "bmp", "ppm", "pgm", "tif", "tiff")
#: ImageNet's channel statistics, applied on the device (the loader hands over uint8).
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class DataError(RuntimeError):
    """The data directory is not a partition of labelled shards."""


@dataclass(frozen=True)
class Partition:
    """A partition's shards and class names, as its manifest lists them."""

    shards: list[tuple[Path, int]]  #: (path, samples) in manifest order
    classes: list[str]

    @property
    def size(self) -> int:
        """Samples in all shards (training and held-out together)."""
        return sum(samples for _, samples in self.shards)


def open_partition(data_dir: str) -> Partition:
    """The shards and class names the partition's manifest lists; DataError when it is not one."""
    path = Path(data_dir) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: {exc} (load the data with dataset.mode: shard)") from exc
    if manifest.get("mode") != "shard":
        raise DataError(f"{path} is the manifest of a {manifest.get('mode')!r} load: use dataset.mode: shard")
    classes = list(manifest.get("classes") or [])
    if not classes:
        raise DataError(f"the shards in {data_dir} carry no class labels: load class folders (<class>/<image>)")
    shards = [(Path(data_dir) / o["key"], int(o.get("samples", 0))) for o in manifest["objects"]]
    partition = Partition(shards, classes)
    if partition.size == 0:
        raise DataError(f"{path} lists no samples")
    return partition


def held_out(key: str, fraction: float) -> bool:
    """Whether a sample is in the evaluation split: the first 8 bytes of its key's sha256, as a fraction."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") < fraction * 2**64


def read_shard(path: Path) -> Iterator[dict[str, Any]]:
    """The samples of one shard as webdataset groups them: {"__key__", "<ext>": bytes, ...}."""
    with open(path, "rb") as stream:
        yield from group_by_keys(tar_file_expander([{"url": str(path), "stream": stream}]))


def decode(sample: dict[str, Any]) -> tuple[Image.Image, int]:
    """A sample's image as RGB (grey digits too: one network for both) and its class index."""
    data = next((sample[ext] for ext in IMAGE_EXTENSIONS if ext in sample), None)
    if data is None or "cls" not in sample:
        raise DataError(f"sample {sample['__key__']} of {sample.get('__url__')} lacks an image or its .cls label")
    with Image.open(io.BytesIO(data)) as opened:
        return opened.convert("RGB"), int(sample["cls"])


def random_crop(image: Image.Image, size: int, scale_min: float, hflip: bool, rng: random.Random) -> Image.Image:
    """A random part (at least `scale_min` of the area, aspect 3/4..4/3) resized to size x size."""
    w, h = image.size
    area = w * h * rng.uniform(scale_min, 1.0)
    aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
    cw, ch = min(w, max(1, round((area * aspect) ** 0.5))), min(h, max(1, round((area / aspect) ** 0.5)))
    x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
    out = image.resize((size, size), Image.BILINEAR, box=(x, y, x + cw, y + ch))
    return out.transpose(Image.FLIP_LEFT_RIGHT) if hflip and rng.random() < 0.5 else out


def center_square(image: Image.Image, size: int) -> Image.Image:
    """The centre square (the short side's) resized to size x size: what evaluation sees."""
    w, h = image.size
    side = min(w, h)
    x, y = (w - side) // 2, (h - side) // 2
    return image.resize((size, size), Image.BILINEAR, box=(x, y, x + side, y + side))


def to_uint8(image: Image.Image) -> torch.Tensor:
    """An RGB image as a uint8 (3, H, W) tensor: a quarter of float32's bytes between loader and trainer."""
    return torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1)


def normalize(batch: torch.Tensor) -> torch.Tensor:
    """uint8 (N, 3, H, W) to float, standardised with ImageNet's channel statistics."""
    mean = torch.tensor(MEAN, device=batch.device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=batch.device).view(1, 3, 1, 1)
    return (batch.float() / 255.0 - mean) / std


class ShardStream(IterableDataset):
    """One process's share of a split, as (uint8 image, label) pairs; `train` cycles, shuffles and crops."""

    def __init__(self, partition: Partition, hp, *, train: bool, epoch: int, rank: int, world: int):
        super().__init__()
        self.partition, self.hp, self.train = partition, hp, train
        self.epoch, self.rank, self.world = epoch, rank, world

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info else (1, 0)
        lanes, lane = self.world * workers, self.rank * workers + worker
        rng = random.Random((self.hp.seed * 1_000_003 + self.epoch) * 7_919 + lane)  # this lane's crops, buffer
        order = random.Random(self.hp.seed * 1_000_003 + self.epoch)  # the shards' order: every lane's the same
        samples = self._lane_samples(lanes, lane, order)
        if self.train:
            samples = shuffled(samples, self.hp.shuffle_buffer, rng)
        hp = self.hp
        for sample in samples:
            image, label = decode(sample)
            if self.train:
                image = random_crop(image, hp.image_size, hp.crop_scale_min, hp.hflip, rng)
            else:
                image = center_square(image, hp.image_size)
            yield to_uint8(image), label

    def _lane_samples(self, lanes: int, lane: int, order: random.Random) -> Iterator[dict[str, Any]]:
        """This lane's samples of the split: its shards, or its every lanes-th sample of all of them."""
        shards = [path for path, _ in self.partition.shards]
        whole_shards = len(shards) >= lanes
        while True:
            ordered = order.sample(shards, len(shards)) if self.train else shards
            index, given = 0, 0
            for path in ordered[lane::lanes] if whole_shards else ordered:
                for sample in read_shard(path):
                    if held_out(sample["__key__"], self.hp.val_fraction) != self.train:
                        if whole_shards or index % lanes == lane:
                            given += 1
                            yield sample
                        index += 1
            if not self.train:
                return
            if not given:
                raise DataError(f"reader {lane} of {lanes} has no training samples: fewer processes or loader workers")


def shuffled(items: Iterator[Any], buffer: int, rng: random.Random) -> Iterator[Any]:
    """`items` through a shuffle buffer of `buffer` (each output a random pick of the buffer)."""
    pool: list[Any] = []
    for item in items:
        if len(pool) < buffer:
            pool.append(item)
            continue
        i = rng.randrange(buffer)
        out, pool[i] = pool[i], item
        yield out
    rng.shuffle(pool)
    yield from pool
