"""`shard` mode: pack many small files into tar shards (WebDataset layout) and upload the shards.

A million small objects are slow to upload and slow to read every epoch; a few hundred 100-200 MB tars
are neither (research note B1). Layout follows WebDataset: a sample is the group of files sharing a key
(the path up to the first dot of the file name), stored consecutively; the class label from the top
folder name is added as `<key>.cls` (its index in the manifest's `classes`). Shards are byte-for-byte
deterministic (sorted input, fixed seed, zeroed tar metadata), so an unchanged input gives unchanged
shards and a re-run uploads nothing. Shard names carry their content hash: a changed shard is a new
object, and readers of the previous manifest keep reading the shards it names.
"""

from __future__ import annotations

import hashlib
import io
import logging
import random
import tarfile
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from boto3.s3.transfer import TransferConfig

from pcflow.dataset.errors import SourceChangedError
from pcflow.dataset.manifest import build_manifest, partition_root
from pcflow.dataset.posix import FsxOwner
from pcflow.dataset.progress import Progress
from pcflow.dataset.sources import Source, SourceFile, open_source
from pcflow.dataset.writer import DEFAULT_TRANSFER, PartitionWriter

log = logging.getLogger(__name__)

DEFAULT_SHARD_BYTES = 128 * 2**20
TAR_BLOCK = 512


@dataclass
class Sample:
    """One WebDataset sample: the source files that share a key, and its class label when the layout gives one."""

    key: str
    files: list[SourceFile] = field(default_factory=list)
    label: int | None = None

    @property
    def size(self) -> int:
        """Bytes this sample adds to a tar: a header and padded data per member (+1 label member)."""
        members = [f.size for f in self.files] + ([8] if self.label is not None else [])
        return sum(TAR_BLOCK + -(-size // TAR_BLOCK) * TAR_BLOCK for size in members)


def sample_key(rel: str) -> tuple[str, str]:
    """`cat/n01.jpg` -> (`cat/n01`, `jpg`); `a/x.seg.png` -> (`a/x`, `seg.png`): WebDataset's rule."""
    folder, _, name = rel.rpartition("/")
    stem, dot, ext = name.partition(".")
    if not stem:
        raise ValueError(f"{rel!r}: a file name must not start with a dot")
    return (f"{folder}/{stem}" if folder else stem), (ext if dot else "bin")


def group_samples(files: list[SourceFile], *, labels_from_folders: bool = True) -> tuple[list[Sample], list[str]]:
    """Files -> samples (sorted by key) and the sorted class names (top-level folders; [] when flat)."""
    samples: dict[str, Sample] = {}
    for f in files:
        key, _ = sample_key(f.rel)
        samples.setdefault(key, Sample(key)).files.append(f)
    classes: list[str] = []
    if labels_from_folders and all("/" in f.rel for f in files):
        classes = sorted({f.rel.split("/", 1)[0] for f in files})
        index = {name: i for i, name in enumerate(classes)}
        for s in samples.values():
            s.label = index[s.key.split("/", 1)[0]]
    return [samples[k] for k in sorted(samples)], classes


def plan_shards(samples: list[Sample], *, target_bytes: int, seed: int | None) -> list[list[Sample]]:
    """Order (shuffled with `seed` when given) and cut into shards of about `target_bytes` each."""
    if target_bytes < 1:
        raise ValueError("target shard size must be positive")
    order = list(samples)
    if seed is not None:
        random.Random(seed).shuffle(order)
    shards: list[list[Sample]] = []
    current: list[Sample] = []
    size = 0
    for sample in order:
        if current and size + sample.size > target_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(sample)
        size += sample.size
    if current:
        shards.append(current)
    return shards


class _HashingFile(io.RawIOBase):
    """A write-only file that hashes what goes through it (the tar's sha256 without a second read)."""

    def __init__(self, raw: IO[bytes]):
        self.raw, self.hash, self.size = raw, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.size

    def write(self, data) -> int:
        self.hash.update(data)
        self.size += len(data)
        return self.raw.write(data)


def _member(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = size, 0, 0o444, 0, 0, "", ""
    return info


def write_shard(src: Source, samples: list[Sample], out: IO[bytes]) -> tuple[str, int]:
    """Write one tar of `samples` to `out`; returns (sha256, size). Deterministic for the same input."""
    sink = _HashingFile(out)
    with tarfile.open(fileobj=sink, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for sample in samples:
            for f in sample.files:
                _, ext = sample_key(f.rel)
                with src.open(f) as fh:
                    tar.addfile(_member(f"{sample.key}.{ext}", f.size), _ExactReader(fh, f, src))
            if sample.label is not None:
                data = str(sample.label).encode()
                tar.addfile(_member(f"{sample.key}.cls", len(data)), io.BytesIO(data))
    return sink.hash.hexdigest(), sink.size


class _ExactReader:
    """Feeds tarfile exactly the listed number of bytes; a file that grew or shrank fails the load."""

    def __init__(self, raw: IO[bytes], item: SourceFile, src: Source):
        self.raw, self.item, self.src, self.left = raw, item, src, item.size

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(self.left if n < 0 else min(n, self.left))
        self.left -= len(data)
        if (n != 0 and not data and self.left) or (self.left == 0 and self.raw.read(1)):
            raise SourceChangedError(f"{self.src.uri}/{self.item.rel} changed size during the load; run again")
        return data


def read_shard(fileobj: IO[bytes]) -> Iterator[dict[str, Any]]:
    """Samples of a shard as WebDataset yields them: {"__key__": key, "<ext>": bytes, ...}."""
    sample: dict[str, Any] | None = None
    with tarfile.open(fileobj=fileobj, mode="r|") as tar:
        for member in tar:
            if not member.isfile():
                continue
            key, ext = sample_key(member.name)
            if sample is None or sample["__key__"] != key:
                if sample is not None:
                    yield sample
                sample = {"__key__": key}
            sample[ext] = tar.extractfile(member).read()
    if sample is not None:
        yield sample


def shard_to_s3(
    client: Any,
    source: str | Source,
    *,
    bucket: str,
    prefix: str,
    partition: str,
    target_shard_bytes: int = DEFAULT_SHARD_BYTES,
    shuffle_seed: int | None = 0,
    tags: Mapping[str, str] | None = None,
    run: str | None = None,
    workers: int = 8,
    transfer_config: TransferConfig = DEFAULT_TRANSFER,
    prune: bool = True,
    progress_interval_s: float = 15.0,
    logger: logging.Logger = log,
    fsx_owner: FsxOwner | None = None,
) -> dict[str, Any]:
    """Pack `source` into tar shards under `s3://bucket/prefix/partition/`; returns a summary.

    Shards are built one at a time on local disk (at most `workers` waiting or uploading, so disk and
    memory stay bounded) and uploaded in parallel. `prune=True` deletes shards of earlier loads that
    the new manifest no longer lists, once the new manifest is committed.
    """
    src = open_source(source, client) if isinstance(source, str) else source
    root = partition_root(prefix, partition)
    files = src.list()
    samples, classes = group_samples(files)
    shards = plan_shards(samples, target_bytes=target_shard_bytes, seed=shuffle_seed)
    writer = PartitionWriter(
        client, bucket, root, tags=tags, workers=workers, transfer_config=transfer_config, fsx_owner=fsx_owner
    )
    progress = Progress(
        total_files=len(files),
        total_bytes=sum(f.size for f in files),
        log=logger,
        label=f"shard {src.uri} -> s3://{bucket}/{root} ({len(shards)} shards)",
        interval_s=progress_interval_s,
    )
    try:
        writer.load_state()
        build_and_upload(src, shards, writer, progress, workers=workers)
        shards_made = {"format": "webdataset-tar", "target_bytes": target_shard_bytes, "seed": shuffle_seed}
        extra = {"classes": classes, "shards": shards_made, "source_files": len(files)}
        where = {"bucket": bucket, "root": root, "partition": partition, "source_uri": src.uri}
        manifest = build_manifest(mode="shard", **where, objects=list(writer.entries.values()), run=run, extra=extra)
        committed = writer.commit(manifest, prune=prune)
    finally:
        writer.close()
    progress.report(final=True)
    return writer.outcome(manifest, committed)


def build_and_upload(
    src: Source, shards: Sequence[Sequence[Sample]], writer: PartitionWriter, progress: Progress, *, workers: int
) -> None:
    """Write each shard to local disk and hand it to the writer's uploads: at most `workers` shards are
    on disk at once (built, waiting or uploading), so a partition larger than the disk still loads."""
    on_disk = threading.BoundedSemaphore(workers)
    width = max(6, len(str(len(shards))))
    with tempfile.TemporaryDirectory(prefix="pcflow-shards-") as tmp:
        for index, members in enumerate(shards):
            on_disk.acquire()
            try:
                path = Path(tmp, f"{index}.tar")
                with path.open("wb") as out:
                    sha, size = write_shard(src, members, out)
            except BaseException:
                on_disk.release()
                raise
            shard = _BuiltShard(
                path=path,
                key=f"shard-{index:0{width}d}-{sha[:12]}.tar",
                size=size,
                sha256=sha,
                samples=len(members),
                source_files=sum(len(s.files) for s in members),
                source_bytes=sum(f.size for s in members for f in s.files),
            )
            writer.submit(_upload_shard, writer, shard, progress, on_disk)
        writer.drain()


@dataclass(frozen=True)
class _BuiltShard:
    path: Path
    key: str
    size: int
    sha256: str
    samples: int
    source_files: int
    source_bytes: int


def _upload_shard(writer: PartitionWriter, shard: _BuiltShard, progress: Progress, on_disk) -> None:
    try:
        entry = writer.current(shard.key, size=shard.size, sha256=shard.sha256)
        uploaded = False
        if entry is None and shard.size < writer.transfer_config.multipart_threshold:
            data = shard.path.read_bytes()
            entry, uploaded = writer.upload_bytes(shard.key, data, shard.sha256, samples=shard.samples)
        elif entry is None:
            entry = writer.put_stream(shard.key, str(shard.path), shard.size, shard.sha256, samples=shard.samples)
            uploaded = True
        writer.record(entry, uploaded=uploaded)
        progress.advance(files=shard.source_files, nbytes=shard.source_bytes, uploaded=uploaded)
    finally:
        shard.path.unlink(missing_ok=True)
        on_disk.release()
