"""The manifest: the one object that says "this partition is complete", written last.

Layout of a loaded partition::

    s3://<bucket>/<prefix>/<partition>/<files or shards...>
    s3://<bucket>/<prefix>/<partition>/manifest.json          <- commit point, replaced only after a good load
    s3://<bucket>/<prefix>/<partition>/_pcflow/journal.json    <- what an unfinished load already uploaded

Readers (the training payload, FSx users) take the object list from the manifest, never from a listing,
so a half-loaded partition is invisible. In a versioned bucket (pcflow's dataset bucket is) the
manifest also records each object's version, so its readers keep reading the bytes it lists while a
later load replaces keys in place (`read_listed_object`). The manifest records size, sha256 and ETag
of every object, so a re-run decides what to skip from one GET and one LIST, without reading any
remote object.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from pcflow.aws.clients import read_object

FORMAT = "pcflow.dataset/1"
#: A manifest or journal: about 200 bytes an object, so this holds a partition of some 300,000 objects.
MAX_DOCUMENT_BYTES = 64 * 1024**2
MANIFEST_NAME = "manifest.json"
JOURNAL_KEY = "_pcflow/journal.json"


def partition_root(prefix: str, partition: str) -> str:
    """`datasets/digits` + `2026-11-29` -> `datasets/digits/2026-11-29/` (the key prefix of one partition)."""
    parts = [p for p in (prefix.strip("/"), partition.strip("/")) if p]
    if not partition.strip("/"):
        raise ValueError("partition must not be empty")
    return "/".join(parts) + "/"


@functools.cache
def code_version() -> str:
    """A digest of the dataset package's sources: which loader wrote a manifest, without needing git."""
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return f"pcflow-dataset-{h.hexdigest()[:12]}"


def content_hash(objects: Iterable[Mapping[str, Any]]) -> str:
    """sha256 over (key, sha256) of every object: two loads with equal hashes hold the same bytes."""
    h = hashlib.sha256()
    for obj in sorted(objects, key=lambda o: o["key"]):
        h.update(f"{obj['key']}\0{obj['sha256']}\n".encode())
    return h.hexdigest()


def build_manifest(
    *,
    mode: str,
    bucket: str,
    root: str,
    partition: str,
    source_uri: str,
    objects: list[dict[str, Any]],
    run: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The manifest of a load: its objects sorted by key and their content hash, so equal loads give equal
    manifests (whatever order the uploads finished in) and a re-run can tell it has nothing to commit."""
    objects = sorted(objects, key=lambda o: o["key"])
    return {
        "format": FORMAT,
        "mode": mode,
        "bucket": bucket,
        "root": root,
        "uri": f"s3://{bucket}/{root}",
        "partition": partition,
        "source": source_uri,
        "code_version": code_version(),
        "run": run,
        "created_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "object_count": len(objects),
        "bytes": sum(o["size"] for o in objects),
        "samples": sum(o.get("samples", 1) for o in objects),
        "content_hash": content_hash(objects),
        **(extra or {}),
        "objects": objects,
    }


def read_json_object(client: Any, bucket: str, key: str) -> dict[str, Any] | None:
    """The JSON document at `key`, or None when there is none (a first load, or a clean partition)."""
    try:
        body = read_object(client, bucket=bucket, key=key, limit=MAX_DOCUMENT_BYTES)
    except ClientError as err:
        if err.response["Error"]["Code"] in ("NoSuchKey", "404"):
            return None
        raise
    return json.loads(body)


def read_manifest(client: Any, bucket: str, root: str) -> dict[str, Any] | None:
    """The partition's committed manifest; one written by another format is treated as absent."""
    doc = read_json_object(client, bucket, root + MANIFEST_NAME)
    return doc if doc and doc.get("format") == FORMAT else None


def read_listed_object(client: Any, bucket: str, root: str, entry: Mapping[str, Any]) -> bytes:
    """The bytes a manifest entry lists: its version when the bucket keeps versions (a load that
    replaced the key later, even one that died before its manifest, does not change them)."""
    version = {"VersionId": entry["version_id"]} if entry.get("version_id") else {}
    return read_object(client, bucket=bucket, key=root + entry["key"], limit=int(entry["size"]), **version)


def summary(manifest: Mapping[str, Any], **counters: int) -> dict[str, Any]:
    """What the operator pushes to XCom: small and JSON-able (never the object list of a big dataset)."""
    return {
        "manifest_uri": f"s3://{manifest['bucket']}/{manifest['root']}{MANIFEST_NAME}",
        "uri": manifest["uri"],
        "bucket": manifest["bucket"],
        "root": manifest["root"],
        "partition": manifest["partition"],
        "mode": manifest["mode"],
        "content_hash": manifest["content_hash"],
        "object_count": manifest["object_count"],
        "bytes": manifest["bytes"],
        "samples": manifest["samples"],
        **counters,
    }
