"""`sync` mode: mirror a source (local directory or S3 prefix) to a partition, file for file.

Skips every file whose size and sha256 (local) or ETag (S3 source) match the committed manifest or the
journal of an interrupted load; uploads the rest in parallel; small files in one PutObject (S3 checks
it against our sha256), large ones multipart through s3transfer, read once and hashed as the parts go
up; publishes manifest.json last. Keys are written in place (as `aws s3 sync` does); in a versioned bucket
(pcflow's dataset bucket is) each manifest names the versions it lists, so readers of an older manifest
still get its bytes, and elsewhere they can tell a replaced object by the ETag that manifest recorded.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import IO, Any

from boto3.s3.transfer import TransferConfig

from pcflow.dataset.errors import SourceChangedError
from pcflow.dataset.manifest import build_manifest, partition_root
from pcflow.dataset.posix import FsxOwner
from pcflow.dataset.progress import Progress
from pcflow.dataset.sources import LocalDirectorySource, Source, SourceFile, iter_chunks, open_source
from pcflow.dataset.writer import DEFAULT_TRANSFER, HashingReader, PartitionWriter

log = logging.getLogger(__name__)


def sync_to_s3(
    client: Any,
    source: str | Source,
    *,
    bucket: str,
    prefix: str,
    partition: str,
    tags: Mapping[str, str] | None = None,
    run: str | None = None,
    workers: int = 16,
    transfer_config: TransferConfig = DEFAULT_TRANSFER,
    prune: bool = False,
    progress_interval_s: float = 15.0,
    logger: logging.Logger = log,
    fsx_owner: FsxOwner | None = None,
) -> dict[str, Any]:
    """Mirror `source` to `s3://bucket/prefix/partition/`; returns a summary (see manifest.summary).

    `prune=True` also deletes objects of the partition that the new manifest does not list (like
    `aws s3 sync --delete`); by default they are left, unlisted, as `aws s3 sync` leaves them.
    """
    src = open_source(source, client) if isinstance(source, str) else source
    root = partition_root(prefix, partition)
    files = src.list()
    writer = PartitionWriter(
        client, bucket, root, tags=tags, workers=workers, transfer_config=transfer_config, fsx_owner=fsx_owner
    )
    progress = Progress(
        total_files=len(files),
        total_bytes=sum(f.size for f in files),
        log=logger,
        label=f"sync {src.uri} -> s3://{bucket}/{root}",
        interval_s=progress_interval_s,
    )
    try:
        writer.load_state()
        for item in files:
            writer.submit(_sync_one, writer, src, item, progress)
        writer.drain()
        manifest = build_manifest(
            mode="sync",
            bucket=bucket,
            root=root,
            partition=partition,
            source_uri=src.uri,
            objects=list(writer.entries.values()),
            run=run,
        )
        committed = writer.commit(manifest, prune=prune)
    finally:
        writer.close()
    progress.report(final=True)
    return writer.outcome(manifest, committed)


def _sync_one(writer: PartitionWriter, src: Source, item: SourceFile, progress: Progress) -> None:
    small = item.size < writer.transfer_config.multipart_threshold
    if isinstance(src, LocalDirectorySource):
        entry, uploaded = (_local_small if small else _local_large)(writer, src, item)
    else:
        entry, uploaded = _remote(writer, src, item, small)
    writer.record(entry, uploaded=uploaded)
    progress.advance(nbytes=item.size, uploaded=uploaded)


def _local_small(writer: PartitionWriter, src: LocalDirectorySource, item: SourceFile):
    """Read once: the same bytes are hashed, compared and (when changed) uploaded."""
    with src.open(item) as fh:
        data = fh.read()
    if len(data) != item.size:
        raise SourceChangedError(f"{src.path(item)} changed size during the load; run again")
    sha = hashlib.sha256(data).hexdigest()
    entry = writer.current(item.rel, size=item.size, sha256=sha)
    if entry:
        return entry, False
    return writer.upload_bytes(item.rel, data, sha)


def _local_large(writer: PartitionWriter, src: LocalDirectorySource, item: SourceFile):
    """One read when the file goes up: s3transfer reads it in order, part by part, and the sha256 is
    computed on those same bytes while earlier parts upload. Only a file the manifest already holds at
    this size is hashed first, to skip it when unchanged; if it then goes up after all, the upload's own
    digest must equal that first one, or the file changed in between."""
    expected = None
    known = writer.current(item.rel, size=item.size)
    if known:
        digest = hashlib.sha256()
        with src.open(item) as fh:
            for chunk in iter_chunks(fh, 8 << 20):
                digest.update(chunk)
        expected = digest.hexdigest()
        if expected == known.get("sha256"):
            return known, False
    with src.open(item) as fh:
        entry = _upload_hashed(writer, src, item, fh, expected=expected)
    src.check_unchanged(item)  # size or mtime moved: what was uploaded may be torn
    return entry, True


def _upload_hashed(
    writer: PartitionWriter, src: Source, item: SourceFile, stream: IO[bytes], *, expected: str | None = None, **extra
):
    """Stream `item` up through a HashingReader; refuse it when its bytes are not the ones listed."""
    reader = HashingReader(stream)
    entry = writer.put_stream(item.rel, reader, item.size, None, **extra)
    where = f"{src.uri.rstrip('/')}/{item.rel}"
    if reader.size != item.size:
        raise SourceChangedError(
            f"{where}: read {reader.size} bytes, listed {item.size}: it changed during the load; "
            "stop whatever writes the source, then run again"
        )
    if expected is not None and reader.hexdigest() != expected:
        raise SourceChangedError(
            f"{where} changed during the load (its sha256 differs between the check and the "
            "upload): stop whatever writes the source, then run again"
        )
    entry["sha256"] = reader.hexdigest()
    return entry


def _remote(writer: PartitionWriter, src: Source, item: SourceFile, small: bool):
    """S3 -> S3: unchanged when the source ETag matches the one recorded; bytes hashed as they stream."""
    entry = writer.current(item.rel, size=item.size, source_version=item.version)
    if entry:
        return entry, False
    with src.open(item) as body:
        if small:
            data = body.read()
            return writer.upload_bytes(item.rel, data, hashlib.sha256(data).hexdigest(), source_version=item.version)
        return _upload_hashed(writer, src, item, body, source_version=item.version), True
