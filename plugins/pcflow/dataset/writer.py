"""Writing one partition: skip what is already there, upload the rest in parallel, commit the manifest last.

Shared by the sync and the shard loader. What "already there" means is decided from the previous good
manifest plus the journal of an unfinished load, each entry confirmed by one LIST of the partition
(same size, same ETag), so neither a re-run nor a resume reads a remote object back. The journal is
rewritten about every second (less often when rewriting it takes long), so a load killed without
warning loses at most that much of its record; an object uploaded in one request in that gap is still
recognised on resume by its listed ETag (the MD5 of its bytes) and adopted with one HEAD, not sent again.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO, Any

from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError
from s3transfer.manager import TransferManager
from s3transfer.subscribers import BaseSubscriber

from pcflow.dataset.errors import DestinationError
from pcflow.dataset.manifest import FORMAT, JOURNAL_KEY, MANIFEST_NAME, read_json_object, read_manifest, summary
from pcflow.dataset.posix import FsxOwner, directory_metadata, object_metadata

log = logging.getLogger(__name__)

MiB = 2**20
#: Objects below 16 MiB go up in one PutObject (one request, S3 checks our sha256); above, multipart in
#: 8 MiB parts (as the AWS CLI) on 10 connections. A streamed file's parts are held in memory until sent,
#: at most 10 at a time (s3transfer's max_in_memory_upload_chunks: 80 MiB); 16 MiB parts held 160 MiB
#: and cost the moto server more per byte.
DEFAULT_TRANSFER = TransferConfig(
    multipart_threshold=16 * MiB, multipart_chunksize=8 * MiB, max_concurrency=10, use_threads=True
)
#: The journal is rewritten at most every JOURNAL_INTERVAL_S, and at most once per JOURNAL_COST_FACTOR
#: times the last rewrite's duration: a big journal (a million files) costs at most a tenth of the time.
JOURNAL_INTERVAL_S = 1.0
JOURNAL_COST_FACTOR = 10
DENIED = {"AccessDenied", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"}


def sha256_b64(hex_digest: str) -> str:
    """A hex sha256 as S3's `ChecksumSHA256` wants it (base64): S3 then refuses an upload whose bytes differ."""
    return base64.b64encode(bytes.fromhex(hex_digest)).decode()


def bucket_region(client: Any, bucket: str) -> str:
    """The bucket's region as S3 reports it (an empty LocationConstraint means us-east-1)."""
    try:
        location = client.get_bucket_location(Bucket=bucket).get("LocationConstraint")
    except ClientError as err:
        code = err.response["Error"]["Code"]
        if code in ("NoSuchBucket", "404"):
            raise DestinationError(
                f"bucket {bucket!r} does not exist: create it (or let the storage stage create it) first"
            ) from err
        if code in DENIED:
            raise DestinationError(
                f"the credentials in use may not read bucket {bucket!r} ({code}): grant s3:GetBucketLocation, "
                "s3:ListBucket, s3:GetObject, s3:PutObject and s3:DeleteObject on it"
            ) from err
        raise
    return {None: "us-east-1", "": "us-east-1", "EU": "eu-west-1"}.get(location, location)


def check_destination(client: Any, bucket: str) -> None:
    """Refuse a bucket in another region before anything is uploaded (S3 would redirect every request)."""
    region = bucket_region(client, bucket)
    if region != client.meta.region_name:
        raise DestinationError(
            f"bucket {bucket!r} is in {region}, but the S3 client is configured for {client.meta.region_name}: "
            f"set region_name={region!r} on the operator (or the connection), or use a bucket in "
            f"{client.meta.region_name}"
        )


class PartitionWriter:
    """Uploads the objects of one partition; thread-safe; `commit()` publishes, `close()` always runs."""

    def __init__(
        self,
        client: Any,
        bucket: str,
        root: str,
        *,
        tags: Mapping[str, str] | None = None,
        workers: int = 16,
        transfer_config: TransferConfig = DEFAULT_TRANSFER,
        journal_interval_s: float = JOURNAL_INTERVAL_S,
        fsx_owner: FsxOwner | None = None,
    ):
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self.client, self.bucket, self.root = client, bucket, root
        self.tagging = urllib.parse.urlencode(dict(tags or {}))
        # What FSx gives each object when it imports it (pcflow.dataset.posix); recorded with each entry.
        self.fsx_owner = fsx_owner
        self.metadata = object_metadata(fsx_owner)
        self.owned = {"fsx_owner": fsx_owner.tag()} if fsx_owner else {}
        self.workers = workers
        self.transfer_config = transfer_config
        self.journal_interval_s = journal_interval_s
        self.previous: dict[str, Any] | None = None
        self.known: dict[str, dict[str, Any]] = {}
        self.remote: dict[str, tuple[int, str]] = {}
        self.entries: dict[str, dict[str, Any]] = {}
        self.uploaded = self.skipped = 0
        self._lock = threading.Lock()
        self._journal_dirty = False
        self._last_journal = time.monotonic()
        self._journal_seconds = 0.0  # how long the last rewrite took
        self._flushing = threading.Lock()  # one rewrite at a time: an older body never lands after a newer one
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pcflow-upload")
        self._slots = threading.BoundedSemaphore(2 * workers)  # bounds memory held by queued work
        self._futures: list[Future] = []
        self._error: BaseException | None = None
        self._transfer: TransferManager | None = None

    # -- what is already there ------------------------------------------------------------------------
    def load_state(self) -> None:
        """Previous manifest + journal entries that the remote listing confirms (same size and ETag)."""
        check_destination(self.client, self.bucket)
        self.previous = read_manifest(self.client, self.bucket, self.root)
        journal = read_json_object(self.client, self.bucket, self.root + JOURNAL_KEY) or {}
        self.remote = self._list_remote()
        candidates = [*(self.previous or {}).get("objects", []), *journal.get("objects", [])]
        for entry in candidates:
            same_owner = entry.get("fsx_owner") == self.owned.get("fsx_owner")
            if same_owner and self.remote.get(entry["key"]) == (entry["size"], entry.get("etag")):
                self.known[entry["key"]] = entry
        log.info(
            "partition s3://%s/%s: %s, %d journaled, %d objects confirmed by listing",
            self.bucket,
            self.root,
            "has a manifest" if self.previous else "no manifest yet",
            len(journal.get("objects", [])),
            len(self.known),
        )

    def _list_remote(self) -> dict[str, tuple[int, str]]:
        found = {}
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.root):
                for obj in page.get("Contents", []):
                    found[obj["Key"][len(self.root) :]] = (obj["Size"], obj["ETag"])
        except ClientError as err:
            raise self._explain(err, "list") from err
        return found

    def current(self, key: str, *, size: int, **identity: str) -> dict[str, Any] | None:
        """The recorded entry for `key` when it matches `identity` (sha256, or the source's version)."""
        entry = self.known.get(key)
        if entry and entry["size"] == size and all(entry.get(k) == v for k, v in identity.items()):
            return entry
        return None

    def unrecorded(self, key: str, data: bytes, sha256: str, **extra: Any) -> dict[str, Any] | None:
        """The entry for `key` when the listing shows these very bytes there though no manifest or journal
        recorded them: a load killed before its next journal put them. A single PUT's ETag is the MD5 of
        its bytes (not under SSE-KMS: then this finds nothing and the bytes go up again); one HEAD names
        the version. So a retry after a crash writes no object twice."""
        listed = self.remote.get(key)
        if listed != (len(data), f'"{hashlib.md5(data, usedforsecurity=False).hexdigest()}"'):
            return None
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self.root + key)
        except ClientError as err:
            if err.response["Error"]["Code"] in ("NoSuchKey", "404"):
                return None  # deleted since the listing
            raise self._explain(err, "read", key) from err
        if head["ETag"] != listed[1] or head.get("Metadata", {}) != self.metadata:
            return None  # replaced since the listing, or written for another owner
        entry = {"key": key, "size": len(data), "sha256": sha256, "etag": head["ETag"], **_version(head)}
        return {**entry, **self.owned, **extra}

    # -- uploads ----------------------------------------------------------------------------------------
    def put_bytes(self, key: str, data: bytes, sha256: str, **extra: Any) -> dict[str, Any]:
        """One PutObject; S3 verifies the body against the sha256 we computed from the same bytes."""
        try:
            resp = self.client.put_object(
                Bucket=self.bucket,
                Key=self.root + key,
                Body=data,
                ChecksumSHA256=sha256_b64(sha256),
                Tagging=self.tagging,
                Metadata=self.metadata,
            )
        except ClientError as err:
            raise self._explain(err, "write", key) from err
        entry = {"key": key, "size": len(data), "sha256": sha256, "etag": resp["ETag"], **_version(resp)}
        return {**entry, **self.owned, **extra}

    def upload_bytes(self, key: str, data: bytes, sha256: str, **extra: Any) -> tuple[dict[str, Any], bool]:
        """(entry, uploaded): `put_bytes`, unless the listing shows these very bytes already there."""
        adopted = self.unrecorded(key, data, sha256, **extra)
        if adopted is not None:
            return adopted, False
        return self.put_bytes(key, data, sha256, **extra), True

    def put_stream(self, key: str, fileobj: str | IO[bytes], size: int, sha256: str | None, **extra: Any):
        """A large object through s3transfer (multipart, parts in parallel); `fileobj` may be a path.

        A stream (e.g. a HashingReader) is read once, in order, part by part, while earlier parts upload;
        at most `max_in_memory_upload_chunks` parts are held. Returns the entry; when sha256 is None the
        caller fills it in from its reader afterwards.
        """
        future = self._transfer_manager().upload(
            fileobj,
            self.bucket,
            self.root + key,
            extra_args={"Tagging": self.tagging, "Metadata": self.metadata},
            subscribers=[_KnownSize(size)],  # multipart decided (and parts sized) without reading ahead
        )
        try:
            future.result()
            head = self.client.head_object(Bucket=self.bucket, Key=self.root + key)
        except ClientError as err:
            raise self._explain(err, "write", key) from err
        entry = {"key": key, "size": size, "sha256": sha256, "etag": head["ETag"], **_version(head)}
        return {**entry, **self.owned, **extra}

    def _transfer_manager(self) -> TransferManager:
        with self._lock:
            if self._transfer is None:
                self._transfer = TransferManager(self.client, self.transfer_config)
            return self._transfer

    def _explain(self, err: ClientError, action: str, key: str = "") -> Exception:
        code = err.response["Error"]["Code"]
        if code in DENIED:
            return DestinationError(
                f"the credentials in use may not {action} s3://{self.bucket}/{self.root}{key} ({code}): grant "
                "s3:ListBucket, s3:GetObject, s3:PutObject, s3:PutObjectTagging and s3:DeleteObject on the "
                "dataset prefix; the previous manifest is unchanged"
            )
        return err

    # -- bookkeeping ------------------------------------------------------------------------------------
    def record(self, entry: dict[str, Any], *, uploaded: bool) -> None:
        """Remember an object as part of the partition (uploaded, or kept as unchanged) and rewrite the journal
        when due, so a crash loses at most the last interval's uploads. Safe from any thread."""
        with self._lock:
            self.entries[entry["key"]] = entry
            if uploaded:
                self.uploaded += 1
            else:
                self.skipped += 1
            if uploaded or entry["key"] not in self.known:  # adopted objects are journaled too
                self._journal_dirty = True
            wait = max(self.journal_interval_s, JOURNAL_COST_FACTOR * self._journal_seconds)
            due = self._journal_dirty and time.monotonic() - self._last_journal >= wait
        if due:
            self.flush_journal(wait=False)

    def flush_journal(self, *, wait: bool = True) -> None:
        """Remember what this load uploaded, so a resume after a crash skips it (one PUT). With
        `wait=False`, returns at once when another thread is writing it (the next rewrite has this)."""
        if not self._flushing.acquire(blocking=wait):
            return
        try:
            with self._lock:
                if not self._journal_dirty:
                    return
                body = json.dumps({"format": FORMAT, "objects": list(self.entries.values())}).encode()
                self._journal_dirty = False
            started = time.monotonic()
            self.client.put_object(
                Bucket=self.bucket, Key=self.root + JOURNAL_KEY, Body=body, Tagging=self.tagging, Metadata=self.metadata
            )
            with self._lock:
                self._last_journal = time.monotonic()
                self._journal_seconds = self._last_journal - started
        finally:
            self._flushing.release()

    # -- the pool ---------------------------------------------------------------------------------------
    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        """Run `fn(*args)` on the pool; blocks while 2 x workers tasks are queued; fails fast."""
        self.raise_if_failed()
        self._slots.acquire()
        future = self._pool.submit(fn, *args)
        future.add_done_callback(self._done)
        self._futures.append(future)

    def _done(self, future: Future) -> None:
        self._slots.release()
        if future.exception() is not None and self._error is None:
            self._error = future.exception()

    def raise_if_failed(self) -> None:
        """Raise the first upload's error, if one failed: the load stops early instead of uploading on after a
        failure."""
        if self._error is not None:
            raise self._error

    def drain(self) -> None:
        """Wait for every upload in flight to finish (each one recorded, for the journal), then raise the first
        failure if any."""
        for future in self._futures:
            future.exception()  # wait without raising: every in-flight upload is finished and recorded
        self._futures.clear()
        self.raise_if_failed()

    # -- publish --------------------------------------------------------------------------------------
    def commit(self, manifest: dict[str, Any], *, prune: bool) -> bool:
        """Write manifest.json (after every object is in), drop the journal, optionally delete stale keys.

        Returns False when the manifest already committed holds the same content: nothing is written.
        """
        self.drain()
        self.put_directory()
        with self._lock:
            self._journal_dirty = False  # the manifest supersedes the journal from here on
        unchanged = bool(self.previous) and self.previous.get("content_hash") == manifest["content_hash"]
        if not unchanged:
            body = json.dumps(manifest, indent=1, sort_keys=True).encode()
            try:
                self.client.put_object(
                    Bucket=self.bucket,
                    Key=self.root + MANIFEST_NAME,
                    Body=body,
                    ContentType="application/json",
                    ChecksumSHA256=sha256_b64(hashlib.sha256(body).hexdigest()),
                    Tagging=self.tagging,
                    Metadata=self.metadata,
                )
            except ClientError as err:
                raise self._explain(err, "write", MANIFEST_NAME) from err
        if JOURNAL_KEY in self.remote or self.uploaded:
            self.client.delete_object(Bucket=self.bucket, Key=self.root + JOURNAL_KEY)
        if prune:
            self.prune({o["key"] for o in manifest["objects"]})
        return not unchanged

    def outcome(self, manifest: dict[str, Any], committed: bool) -> dict[str, Any]:
        """The load's summary (`manifest.summary`), whether this load wrote the manifest, and which run's
        load committed the content the partition now holds (`committed_by`: the lineage's new-data test)."""
        current = manifest if committed else (self.previous or {})
        counters = summary(manifest, uploaded=self.uploaded, skipped=self.skipped)
        return {**counters, "manifest_written": committed, "committed_by": current.get("run")}

    def put_directory(self) -> None:
        """The partition's directory object (its key the partition's, ending in `/`), with the metadata that
        makes FSx import the directory as the SSH user's alone; none without an owner. Put before the
        manifest: FSx imports the partition once its manifest is there."""
        if self.fsx_owner is None:
            return
        metadata = directory_metadata(self.fsx_owner)
        try:
            self.client.put_object(Bucket=self.bucket, Key=self.root, Body=b"", Tagging=self.tagging, Metadata=metadata)
        except ClientError as err:
            raise self._explain(err, "write") from err

    def prune(self, keep: set[str]) -> int:
        """Delete objects of the partition the committed manifest does not list (older shards, removed files)."""
        # "": the partition's own directory object (put_directory)
        stale = [k for k in self._list_remote() if k not in keep and k not in (MANIFEST_NAME, JOURNAL_KEY, "")]
        for start in range(0, len(stale), 1000):
            batch = [{"Key": self.root + k} for k in stale[start : start + 1000]]
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
        if stale:
            log.info("pruned %d objects no longer in the manifest of s3://%s/%s", len(stale), self.bucket, self.root)
        return len(stale)

    def close(self) -> None:
        """Always called: waits for in-flight work, keeps the journal of what got uploaded, frees threads."""
        try:
            for future in self._futures:
                future.exception()
            if self.entries:
                self.flush_journal()
        finally:
            self._pool.shutdown(wait=True)
            if self._transfer is not None:
                self._transfer.shutdown()


class _KnownSize(BaseSubscriber):
    """Tells s3transfer the size of a stream it cannot stat, so it can size parts (S3 allows 10,000)."""

    def __init__(self, size: int):
        self.size = size

    def on_queued(self, future: Any, **kwargs: Any) -> None:
        future.meta.provide_transfer_size(self.size)


class HashingReader:
    """A read-only stream that computes the sha256 of exactly what was read through it, in order."""

    def __init__(self, raw: IO[bytes]):
        self.raw, self.hash, self.size = raw, hashlib.sha256(), 0

    def read(self, n: int = -1) -> bytes:
        """Read from the underlying stream, hashing and counting what was read."""
        data = self.raw.read(n)
        self.hash.update(data)
        self.size += len(data)
        return data

    def hexdigest(self) -> str:
        """The sha256 of everything read so far: after an upload, of exactly the bytes sent."""
        return self.hash.hexdigest()


def _version(response: Mapping[str, Any]) -> dict[str, str]:
    """`{"version_id": ...}` in a versioned bucket: the manifest then names the exact bytes it lists,
    which a later load replacing the key does not change for its readers."""
    version = response.get("VersionId")
    return {"version_id": version} if version and version != "null" else {}
