"""A bundle into the stack's bucket once: under a key named by its id (`pcflow/code/<digest>.tar`), asked for
before it is sent (HEAD), so a re-run of the same code sends nothing. S3 checks the bytes on the way in
(ChecksumSHA256); an object already there is kept only when its recorded SHA-256 is the bundle's."""

from __future__ import annotations

import urllib.parse
from typing import Any

from botocore.exceptions import ClientError

from pcflow.checksums import s3_checksum
from pcflow.metrics.outputs import SHA256_KEY
from pcflow.naming import Component, standard_tags

PREFIX = "pcflow/code/"


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
