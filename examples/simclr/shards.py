"""WebDataset tar shards, streamed: what the dataset stage's `shard` mode writes (plugins/pcflow/dataset/shard.py).

The partition's `manifest.json` lists the shards (with their sample counts) and the class names; it
sits in `data_dir` (the FSx mount or the staged copy) or at `s3://bucket/prefix/partition/`, where the
shards are read straight from S3 (the version the manifest names). A sample is `<class>/<name>.<image>`
plus `<class>/<name>.cls`, the class's index in the manifest's `classes`. Nothing is unpacked to
disk: each shard is one sequential stream, cut into samples by webdataset's tar iterator.

Every epoch each rank reads its own contiguous share of one global order (the shards in a seeded
permutation, starting at a seeded offset, so even a one-shard dataset is split differently every
epoch). Shares are equal (the remainder is dropped), so every rank takes the same number of steps; a
share may start inside a shard, whose first samples are then read and passed over (at most one shard
per rank per epoch, read last, so the first batch comes from the start of a shard). Within its share
a rank shuffles through a buffer. Same seed, same world size: same batches.
"""

from __future__ import annotations

import io
import json
import queue
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from data import DataError
from PIL import Image
from s3stream import is_s3, open_object, read_object
from webdataset.filters import shuffle
from webdataset.tariterators import group_by_keys, tar_file_expander

MANIFEST = "manifest.json"
PREFETCH_BATCHES = 4
IMAGE_EXTENSIONS = ("png", "jpg", "jpeg", "webp", "bmp", "pgm", "ppm", "tif", "tiff")


@dataclass(frozen=True)
class Shard:
    url: str  #: a local path or s3://bucket/key
    samples: int
    version_id: str | None = None


@dataclass(frozen=True)
class Piece:
    """The part of one shard a rank reads in one epoch: `take` samples after the first `skip`."""

    shard: Shard
    skip: int
    take: int


def read_manifest(data_dir: str) -> dict[str, Any] | None:
    """The partition's manifest, or None when `data_dir` (a local directory) has none."""
    if is_s3(data_dir):
        url = data_dir.rstrip("/") + "/" + MANIFEST
        try:
            return json.loads(read_object(url))
        except Exception as exc:
            raise DataError(f"cannot read {url}: {exc}") from exc
    path = Path(data_dir) / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else None


def open_stream(shard: Shard) -> IO[bytes]:
    """A local file (the kernel reads ahead) or an S3 object (s3stream.py reads ahead)."""
    return open_object(shard.url, shard.version_id) if is_s3(shard.url) else open(shard.url, "rb")


def plan(shards: list[Shard], *, start: int, count: int) -> list[Piece]:
    """`count` samples of the shards laid end to end (a ring), from global position `start`."""
    total = sum(s.samples for s in shards)
    if count > total:
        raise ValueError(f"{count} samples asked of {total}")
    pieces, position = [], start % total if total else 0
    while count > 0:
        offset = position
        for shard in shards:  # the shard holding `position`
            if offset < shard.samples:
                break
            offset -= shard.samples
        take = min(count, shard.samples - offset)
        pieces.append(Piece(shard, offset, take))
        count -= take
        position = (position + take) % total
    return pieces


class ShardDataset:
    """The shards a manifest lists, read as streams; `batches` gives one rank's batches of an epoch."""

    def __init__(self, data_dir: str, manifest: dict[str, Any], *, shuffle_buffer: int = 1000, seed: int = 0):
        if manifest.get("mode") != "shard":
            raise DataError(f"the manifest in {data_dir} is of a {manifest.get('mode')!r} load, not `shard`")
        base = data_dir.rstrip("/")
        self.shards = [
            Shard(f"{base}/{o['key']}", int(o.get("samples", 0)), o.get("version_id")) for o in manifest["objects"]
        ]
        self.classes = list(manifest.get("classes") or [])
        if not self.classes:
            raise DataError(f"the shards in {data_dir} carry no class labels: load class folders (<class>/<image>)")
        self.size = sum(s.samples for s in self.shards)
        if self.size == 0:
            raise DataError(f"the manifest in {data_dir} lists no samples")
        self.source = data_dir
        self.shuffle_buffer, self.seed = shuffle_buffer, seed

    def share(self, epoch: int, rank: int, world: int, count: int) -> list[Piece]:
        """This rank's pieces for `epoch`: `count` samples from its place in the epoch's global order."""
        rng = random.Random(self.seed * 1_000_003 + epoch)
        order = rng.sample(self.shards, len(self.shards))
        start = rng.randrange(self.size) + rank * (self.size // world)
        pieces = plan(order, start=start, count=count)
        return sorted(pieces, key=lambda piece: piece.skip > 0)  # the first batch never waits for a skip

    def batches(self, epoch: int, rank: int, world: int, per_rank: int, steps: int) -> Iterator[torch.Tensor]:
        """`steps` batches of `per_rank` images; decoded in a background thread while the caller trains."""
        samples = self.samples(self.share(epoch, rank, world, per_rank * steps))
        mixed = shuffle(self.shuffle_buffer, seed=self.seed * 1_000_003 + epoch * 7_919 + rank * 104_729)(samples)
        return prefetch(_batched(map(decode, mixed), per_rank), depth=PREFETCH_BATCHES)  # decode after the shuffle

    def samples(self, pieces: list[Piece]) -> Iterator[dict[str, Any]]:
        """Every sample of the pieces, in order, as webdataset gives it ({"__key__", "<ext>": bytes})."""
        for piece in pieces:
            stream = open_stream(piece.shard)
            try:
                raw = group_by_keys(tar_file_expander([{"url": piece.shard.url, "stream": stream}]))
                yield from islice(raw, piece.skip, piece.skip + piece.take)
            finally:
                stream.close()

    def eval_set(self, limit: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first `limit` samples in manifest order, with their labels (the probes' data)."""
        pieces = plan(self.shards, start=0, count=min(limit, self.size))
        pairs = [decode(sample) for sample in self.samples(pieces)]
        return to_tensor([image for image, _ in pairs]), torch.tensor([label for _, label in pairs])


def decode(sample: dict[str, Any]) -> tuple[np.ndarray, int]:
    image = next((sample[ext] for ext in IMAGE_EXTENSIONS if ext in sample), None)
    if image is None or "cls" not in sample:
        raise DataError(f"sample {sample['__key__']} of {sample['__url__']} lacks an image or its .cls label")
    with Image.open(io.BytesIO(image)) as opened:
        pixels = np.asarray(opened.convert("L"), dtype=np.uint8)
    return pixels, int(sample["cls"])


def to_tensor(images: list[np.ndarray]) -> torch.Tensor:
    """uint8 (H, W) images of one size -> float (N, 1, H, W) in [0, 1]."""
    shapes = {image.shape for image in images}
    if len(shapes) != 1:
        raise DataError(f"images of different sizes in one batch: {sorted(shapes)}")
    return torch.from_numpy(np.stack(images)).unsqueeze(1).float().div_(255.0)


def _batched(samples: Iterator[tuple[np.ndarray, int]], size: int) -> Iterator[torch.Tensor]:
    while batch := list(islice(samples, size)):
        yield to_tensor([image for image, _ in batch])


def prefetch(items: Iterator[Any], depth: int) -> Iterator[Any]:
    """`items`, produced up to `depth` ahead by a daemon thread (file and S3 reads and PNG decoding
    release the GIL); an exception there is raised here, in order."""
    slots: queue.Queue = queue.Queue(maxsize=depth)
    done = object()

    def produce() -> None:
        try:
            for item in items:
                slots.put((item, None))
        except BaseException as exc:  # handed to the consumer
            slots.put((None, exc))
        slots.put((done, None))

    threading.Thread(target=produce, name="pcflow-prefetch", daemon=True).start()
    while True:
        item, error = slots.get()
        if error is not None:
            raise error
        if item is done:
            return
        yield item
