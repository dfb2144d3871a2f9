"""A bundle into the stack's bucket once: under a key named by its id (`pcflow/code/<digest>.tar`), asked for
before it is sent (HEAD), so a re-run of the same code sends nothing. S3 checks the bytes on the way in
(ChecksumSHA256); an object already there is kept only when its recorded SHA-256 is the bundle's.

A git commit always packs to the same bundle (the same files, the same filter), so what it packed to is
recorded beside it (`pcflow/code/git/<key>.json`: the id, the archive's SHA-256, every file's, and the
commit's hyperparameter schema): a later run of that commit checks the cluster's copy against the record
without fetching or packing anything, its first task checks the hyperparameters against the recorded
schema, and a cluster without a copy stages the bundle read back from the bucket, its SHA-256 verified."""

from __future__ import annotations

import hashlib
import json
import urllib.parse
from typing import Any

from botocore.exceptions import ClientError

from pcflow.checksums import SHA256_KEY, ChecksumMismatch, s3_checksum, sha256_hex
from pcflow.naming import Component, standard_tags

PREFIX = "pcflow/code/"
#: A record is a few hundred bytes a file: one over this is not pcflow's and is not read.
MAX_RECORD_BYTES = 32 << 20


def _same_hash(head: dict[str, Any], sha256: str) -> bool:
    """Whether the object HEAD describes holds these bytes: S3's own ChecksumSHA256 where it answers with one,
    else the sha256 pcflow recorded in its metadata at upload (what the local stack's moto returns)."""
    if head.get("ChecksumSHA256"):
        return head["ChecksumSHA256"] == s3_checksum(sha256)
    return head.get("Metadata", {}).get(SHA256_KEY) == sha256


def bundle_key(digest: str) -> str:
    """The bundle's key in the bucket: content-addressed, so one object per distinct tree."""
    return f"{PREFIX}{digest}.tar"


def upload_once(s3: Any, bucket: str, bundle: Any, *, stack: str) -> dict[str, Any]:
    """The bundle at `bundle_key` in `bucket`: {"key", "uploaded_bytes"} (0 when the same bytes were there).
    Tagged with the stack, not a run: every run of the same code shares it."""
    key = bundle_key(bundle.digest)
    try:
        head = s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
            raise
        head = None
    if head is not None and head.get("ContentLength") == len(bundle.data) and _same_hash(head, bundle.sha256):
        return {"key": key, "uploaded_bytes": 0}
    s3.put_object(
        Bucket=bucket,
        Key=key,
        Body=bundle.data,
        ContentType="application/x-tar",
        ChecksumSHA256=s3_checksum(bundle.sha256),
        Metadata={SHA256_KEY: bundle.sha256},
        Tagging=urllib.parse.urlencode(standard_tags(stack=stack, component=Component.TRAIN)),
    )
    return {"key": key, "uploaded_bytes": len(bundle.data)}


def commit_key(url: str, commit: str, subdir: str | None, limits: dict[str, Any]) -> str:
    """Where the record of what this commit packed to lives: one per repository, commit, subdirectory,
    packing (bundle.PACKING) and limits, so a change in any of them packs again."""
    from pcflow.bundles import PACKING

    # max_mib as the run document always held it (a float: 64 and 64.0 are one packing, one record)
    parts = [url, commit, subdir or "", PACKING, float(limits["max_mib"]), bool(limits["allow_secrets"])]
    return f"{PREFIX}git/{hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:40]}.json"


def record_commit(
    s3: Any, bucket: str, key: str, bundle: Any, *, stack: str, hparams_schema: dict[str, Any] | None = None
) -> None:
    """What the commit packed to, for later runs of it (see the module's docstring), and its hyperparameter
    schema where it was read (pcflow.code.hparams: {"path", "text"}, text None for none), so the first
    task of a later run checks against it without fetching anything."""
    record = {
        "name": bundle.name,
        "digest": bundle.digest,
        "sha256": bundle.sha256,
        "files": bundle.files,
        "bytes": len(bundle.data),
        "content_bytes": bundle.content_bytes,
        "checksums": bundle.checksums.decode(),
        **({"hparams_schema": hparams_schema} if hparams_schema else {}),
    }
    s3.put_object(
        Bucket=bucket,
        Key=key,
        Body=json.dumps(record).encode(),
        ContentType="application/json",
        Tagging=urllib.parse.urlencode(standard_tags(stack=stack, component=Component.TRAIN)),
    )


def recorded_commit(s3: Any, bucket: str, key: str) -> dict[str, Any] | None:
    """The record at `key`, or None when there is none (nor, on a first run, its bucket) or it is not one
    pcflow wrote (packed again)."""
    try:
        got = s3.get_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound", "NoSuchBucket"):
            return None
        raise
    if got["ContentLength"] > MAX_RECORD_BYTES:
        return None
    try:
        record = json.loads(got["Body"].read(MAX_RECORD_BYTES))
    except ValueError:
        return None
    wanted = {"name": str, "digest": str, "sha256": str, "files": int, "bytes": int, "checksums": str}
    if not isinstance(record, dict) or not all(isinstance(record.get(k), t) for k, t in wanted.items()):
        return None
    return record if record["digest"] == record["sha256"][: len(record["digest"])] else None


def bundle_from_bucket(s3: Any, bucket: str, record: dict[str, Any]) -> Any:
    """The recorded bundle read back from the bucket, refused (ChecksumMismatch) unless its bytes are the
    recorded ones; None when it is no longer there."""
    from pcflow.bundles import Bundle

    try:
        got = s3.get_object(Bucket=bucket, Key=bundle_key(record["digest"]))
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return None
        raise
    data = got["Body"].read(record["bytes"] + 1)
    if sha256_hex(data) != record["sha256"]:
        raise ChecksumMismatch(
            f"s3://{bucket}/{bundle_key(record['digest'])} is not the bundle recorded for it (sha256 "
            f"{sha256_hex(data)}, recorded {record['sha256']}): delete it and the run packs the code again"
        )
    checksums = record["checksums"].encode()
    return Bundle(
        record["name"],
        data,
        record["digest"],
        record["files"],
        checksums,
        record.get("content_bytes", 0),
        record["sha256"],
    )
