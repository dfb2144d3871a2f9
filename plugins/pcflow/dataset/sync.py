"""`sync` mode: mirror a source (local directory or S3 prefix) to a partition, file for file.

Skips every file whose size and sha256 (local) or ETag (S3 source) match the committed manifest or the
journal of an interrupted load; uploads the rest in parallel; small files in one PutObject, large ones
multipart through s3transfer; publishes manifest.json last.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import Any

from boto3.s3.transfer import TransferConfig

from pcflow.dataset.errors import SourceChangedError, SourceError
from pcflow.dataset.manifest import build_manifest, partition_root, summary
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
) -> dict[str, Any]:
    """Mirror `source` to `s3://bucket/prefix/partition/`; returns a summary (see manifest.summary).

    `prune=True` also deletes objects of the partition that the new manifest does not list (like
    `aws s3 sync --delete`); by default they are left, unlisted, as `aws s3 sync` leaves them.
    """
    src = open_source(source, client) if isinstance(source, str) else source
    root = partition_root(prefix, partition)
    files = src.list()
    writer = PartitionWriter(client, bucket, root, tags=tags, workers=workers, transfer_config=transfer_config)
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
    return {
        **summary(manifest, uploaded=writer.uploaded, skipped=writer.skipped),
        "manifest_written": committed,
    }


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
    return writer.put_bytes(item.rel, data, sha), True


def _local_large(writer: PartitionWriter, src: LocalDirectorySource, item: SourceFile):
    """Hash first (to skip unchanged files), upload by path, then prove the file did not change meanwhile."""
    digest = hashlib.sha256()
    with src.open(item) as fh:
        for chunk in iter_chunks(fh, 8 << 20):
            digest.update(chunk)
    sha = digest.hexdigest()
    entry = writer.current(item.rel, size=item.size, sha256=sha)
    if entry:
        return entry, False
    entry = writer.put_stream(item.rel, str(src.path(item)), item.size, sha)
    src.check_unchanged(item)  # size or mtime moved: what was uploaded may be torn
    return entry, True


def _remote(writer: PartitionWriter, src: Source, item: SourceFile, small: bool):
    """S3 -> S3: unchanged when the source ETag matches the one recorded; bytes hashed as they stream."""
    entry = writer.current(item.rel, size=item.size, source_version=item.version)
    if entry:
        return entry, False
    with src.open(item) as body:
        if small:
            data = body.read()
            return writer.put_bytes(item.rel, data, hashlib.sha256(data).hexdigest(), source_version=item.version), True
        reader = HashingReader(body)
        entry = writer.put_stream(item.rel, reader, item.size, None, source_version=item.version)
    if reader.size != item.size:
        raise SourceError(f"{src.uri}{item.rel}: read {reader.size} bytes, listed {item.size}; run again")
    entry["sha256"] = reader.hexdigest()
    return entry, True
