"""Where a dataset comes from: a local directory or an S3 prefix, listed once, read file by file.

Both kinds answer the same three questions (what files, how big, what are their bytes) so the sync and
shard loaders never care where the data lives. Listing is sorted, so everything derived from it (shard
membership, manifest order) is deterministic.
"""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from botocore.exceptions import ClientError

from pcflow import datasource
from pcflow.dataset.errors import SourceChangedError, SourceError
from pcflow.datasource import DatasetSource, SourceRefused, parse_source
from pcflow.paths import within

#: Names never loaded: editor and OS droppings, and pcflow's own bookkeeping when the source is a partition.
IGNORED_NAMES = frozenset({".DS_Store", "Thumbs.db", "manifest.json"})
IGNORED_DIRS = frozenset({"_pcflow", ".git", "__pycache__"})


@dataclass(frozen=True)
class SourceFile:
    """One file of the source; `version` is what proves it unchanged (mtime_ns locally, ETag on S3)."""

    rel: str
    size: int
    version: str


class Source(Protocol):
    """What a loader needs of a dataset source, wherever it lives: a sorted listing, whether it holds anything,
    a file's bytes, and proof that a file did not change while it was read."""

    uri: str

    def list(self) -> list[SourceFile]:
        """Every file to load, sorted by path (so shards and manifests come out the same each time)."""

    def holds_data(self) -> bool:
        """Whether the source has any file, found without listing all of it (the first task's check)."""

    def open(self, item: SourceFile) -> IO[bytes]:
        """The bytes of a listed file, refused when they are no longer the listed version where the source can tell."""

    def check_unchanged(self, item: SourceFile) -> None:
        """Refuse a file that changed since it was listed, after its bytes were read."""


class LocalDirectorySource:
    """A directory on the worker. Symlinks are followed while they stay inside it: one that leads out of
    the source, or back into a directory above it (a loop), fails the listing; a dangling one is an
    unreadable file. Only regular files are loaded (a FIFO or device would hang or never end)."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root).expanduser()
        self.uri = str(self.root)

    def list(self) -> list[SourceFile]:
        """Every regular file under the directory, sorted; an empty source is refused (loading nothing is a
        mistake, not a success)."""
        items = [SourceFile(rel, st.st_size, str(st.st_mtime_ns)) for rel, st in self._walk(self.top, "")]
        if not items:
            raise SourceError(f"dataset source {self.uri!r} holds no files: nothing to load")
        return sorted(items, key=lambda f: f.rel)

    def holds_data(self) -> bool:
        """Whether the listing would find a file (the walk stops at the first one)."""
        return next(self._walk(self.top, ""), None) is not None

    @functools.cached_property
    def top(self) -> Path:
        """The source with its own symlinks resolved: what every file must stay under."""
        if not self.root.is_dir():
            raise SourceError(f"dataset source {self.uri!r} is not a directory on this worker: check the path")
        return Path(os.path.realpath(self.root))

    def _walk(self, directory: Path, rel: str, above: frozenset = frozenset()) -> Iterator[tuple[str, os.stat_result]]:
        """(relative path, stat) of every file to load under `directory`; `above` holds the (device,
        inode) of the directories that lead here, so a link back to one of them is a loop."""
        st = directory.stat()
        above = above | {(st.st_dev, st.st_ino)}
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as err:
            raise SourceError(f"cannot list {directory}: {err.strerror}; fix it and run again") from err
        for entry in entries:
            if entry.name.startswith(".") or entry.name in IGNORED_NAMES:
                continue
            path = Path(entry.path)
            st = self._stat_inside(path) if entry.is_symlink() else _stat(path)
            if stat.S_ISDIR(st.st_mode):
                if (st.st_dev, st.st_ino) in above:
                    raise SourceError(f"{path} is a symlink loop (it leads back to a directory above it): remove it")
                if entry.name not in IGNORED_DIRS:
                    yield from self._walk(path, f"{rel}{entry.name}/", above)
            elif stat.S_ISREG(st.st_mode):
                yield f"{rel}{entry.name}", st
            else:
                raise SourceError(f"{path} is not a regular file (a FIFO, socket or device): remove it from the source")

    def _stat_inside(self, link: Path) -> os.stat_result:
        """What a symlink leads to, refused when that is outside the source; dangling: unreadable."""
        try:
            within(link, self.top)
        except ValueError:
            raise SourceError(
                f"{link} is a symlink to {os.path.realpath(link)}, outside the dataset source {self.uri!r}: a load "
                "reads only what is under its source"
            ) from None
        return _stat(link)

    def path(self, item: SourceFile) -> Path:
        """The file, checked again to be inside the source (a link may have changed since the listing)."""
        try:
            return within(self.root / item.rel, self.top)
        except ValueError:
            raise SourceChangedError(
                f"{self.root / item.rel} now leads outside the dataset source; run again"
            ) from None

    def open(self, item: SourceFile) -> IO[bytes]:
        """The file's bytes; an unreadable file fails the load, naming it."""
        try:
            return self.path(item).open("rb")
        except OSError as err:
            raise SourceError(f"cannot read {self.path(item)}: {err.strerror}; fix or remove it and run again") from err

    def check_unchanged(self, item: SourceFile) -> None:
        """Refuse a file whose size or mtime moved since it was listed (or that disappeared): the load would mix
        versions."""
        try:
            st = self.path(item).stat()
        except OSError as err:
            raise SourceChangedError(f"{self.path(item)} disappeared during the load; run again") from err
        if (st.st_size, str(st.st_mtime_ns)) != (item.size, item.version):
            raise SourceChangedError(
                f"{self.path(item)} changed during the load (size/mtime differ from when it was listed): "
                "stop whatever writes the source, then run again"
            )


def _stat(path: Path) -> os.stat_result:
    try:
        return path.stat()
    except OSError as err:
        raise SourceError(f"cannot read {path}: {err.strerror}; fix or remove it and run again") from err


class S3PrefixSource:
    """Objects under `s3://bucket/prefix/`; reads are pinned to the listed ETag (If-Match), so an object
    overwritten mid-load fails the load instead of mixing versions."""

    def __init__(self, client: Any, uri: str):
        self.client = client
        self.uri = uri
        self.bucket, self.prefix = split_s3_uri(uri)

    def list(self) -> list[SourceFile]:
        """Every object under the prefix, sorted, with its ETag as the version; an empty prefix is refused."""
        items = list(self._objects())
        if not items:
            raise SourceError(f"dataset source {self.uri} holds no objects: nothing to load")
        return sorted(items, key=lambda f: f.rel)

    def holds_data(self) -> bool:
        """Whether the listing would find an object (it stops at the first page that has one)."""
        return next(self._objects(), None) is not None

    def _objects(self) -> Iterator[SourceFile]:
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix):
                for obj in page.get("Contents", []):
                    rel = obj["Key"][len(self.prefix) :]
                    parts = rel.split("/")
                    if not rel or rel.endswith("/") or parts[-1] in IGNORED_NAMES or IGNORED_DIRS & set(parts):
                        continue
                    yield SourceFile(rel, obj["Size"], obj["ETag"])
        except ClientError as err:
            raise SourceError(f"cannot list dataset source {self.uri}: {err}") from err

    def open(self, item: SourceFile) -> IO[bytes]:
        """The object's bytes as listed (If-Match its ETag): one overwritten since the listing fails the load
        rather than mixing versions."""
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=self.prefix + item.rel, IfMatch=item.version)
        except ClientError as err:
            if err.response["Error"]["Code"] in ("PreconditionFailed", "412"):
                raise SourceChangedError(f"{self.uri}{item.rel} was overwritten during the load; run again") from err
            raise SourceError(f"cannot read {self.uri}{item.rel}: {err}") from err
        return resp["Body"]

    def check_unchanged(self, item: SourceFile) -> None:
        """Nothing to do: If-Match on every read already proves the bytes are the listed version."""


def split_s3_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/a/b` -> (`bucket`, `a/b/`) (pcflow.datasource), refused as a `SourceError`: a malformed
    URI fails a load like any other bad source."""
    try:
        return datasource.split_s3_uri(uri)
    except SourceRefused as exc:
        raise SourceError(str(exc)) from None


def open_source(uri: str | os.PathLike[str] | DatasetSource, s3_client: Any) -> Source:
    """The source a user names (pcflow.datasource): an S3 prefix, or a local directory; a built-in is a
    directory only once the pipeline's `dataset_source` task has made it one."""
    try:
        source = uri if isinstance(uri, DatasetSource) else parse_source(uri)
    except SourceRefused as exc:
        raise SourceError(str(exc)) from None
    if source.kind == "s3":
        return S3PrefixSource(s3_client, source.text)
    return LocalDirectorySource(source.text)


def iter_chunks(stream: IO[bytes], size: int = 1 << 20) -> Iterator[bytes]:
    """A stream's bytes in chunks of `size`, so hashing or copying a large file never holds it whole."""
    while chunk := stream.read(size):
        yield chunk
