"""Load an artifact an earlier run kept (its `model.pt`, a checkpoint) only if it is still the bytes that
run wrote.

The run that wrote it recorded each file's sha256, computed on the cluster before the copy
(`pcflow.metrics.outputs`), in its summary and in its model's asset event (`model_sha256`,
`checkpoint_sha256`). That record, in Airflow's metadata database, is what counts, not the object's own
metadata or checksum, which whoever can write the bucket can replace along with the bytes. The download
is bounded (a size limit checked before and while reading), lands under a temporary name beside the
destination and is renamed into place only once its hash matches; anything else is removed and refused.
A model is a pickle: loading one that changed would run whatever its writer wanted.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from pcflow.checksums import SHA256_HEX, ChecksumMismatch, HashingReader
from pcflow.errors import ConfigurationError

#: The largest artifact loaded unless the caller says otherwise (a checkpoint with optimizer state).
MAX_ARTIFACT_BYTES = 8 << 30
CHUNK_BYTES = 1 << 20


class ArtifactRefused(ChecksumMismatch, ConfigurationError):
    """The artifact is not the one the run recorded (changed, too large, not there): not loaded, not retried."""


def split_s3_uri(uri: str) -> tuple[str, str]:
    """Bucket and key of an artifact's URI; anything but `s3://bucket/key` is refused before a request."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    if not uri.startswith("s3://") or not bucket or not key:
        raise ArtifactRefused(f"{uri!r} is not an s3://bucket/key URI of an artifact")
    return bucket, key


def load_artifact(
    s3: Any, uri: str, sha256: str, dest: str | os.PathLike[str], *, max_bytes: int = MAX_ARTIFACT_BYTES
) -> Path:
    """Download `uri` to `dest` if its bytes have the recorded `sha256` (hex); refuse anything else."""
    if not isinstance(sha256, str) or not SHA256_HEX.fullmatch(sha256):
        raise ArtifactRefused(f"{uri}: {sha256!r} is not a recorded sha256; an artifact is loaded only with its hash")
    bucket, key = split_s3_uri(uri)
    body = s3.get_object(Bucket=bucket, Key=key)
    size = int(body["ContentLength"])
    if size > max_bytes:
        body["Body"].close()
        raise ArtifactRefused(f"{uri} is {size} bytes, over the {max_bytes}-byte limit for an artifact; not loaded")
    dest = Path(dest)
    tmp = dest.with_name(f".{dest.name}.tmp-{uuid.uuid4().hex[:8]}")
    what = f"{uri} (sha256 recorded by the run that wrote it)"
    reader = HashingReader(body["Body"], size=size, sha256=sha256, what=what)
    try:
        with tmp.open("xb") as out:
            while chunk := reader.read(CHUNK_BYTES):
                out.write(chunk)
        reader.check()
        tmp.replace(dest)
    except ChecksumMismatch as exc:
        raise ArtifactRefused(
            f"{exc}. Someone changed the object after that run; find out who before using it."
        ) from None
    finally:
        body["Body"].close()
        tmp.unlink(missing_ok=True)
    return dest
