"""A partition of the digits as pcflow's `shard` mode writes it (the real writer, into an in-process moto
S3), copied to a directory as the stage-in does: the manifest beside the shards it lists."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pcflow.dataset.digits import materialize_digits
from pcflow.dataset.manifest import read_manifest
from pcflow.dataset.shard import shard_to_s3

BUCKET = "example-shards"


def digits_partition(dest: Path, *, shard_bytes: int = 200_000) -> Path:
    """`dest` holding manifest.json and the digits' shards (several of them: `shard_bytes` each)."""
    import boto3
    from moto import mock_aws

    saved = {name: os.environ.pop(name) for name in ("AWS_ENDPOINT_URL", "AWS_CA_BUNDLE") if name in os.environ}
    try:
        with mock_aws():
            s3 = boto3.client("s3", region_name="us-east-1")
            s3.create_bucket(Bucket=BUCKET)
            source = materialize_digits(dest.parent / f"{dest.name}-images")
            loaded = shard_to_s3(
                s3, str(source), bucket=BUCKET, prefix="ds", partition="p", target_shard_bytes=shard_bytes
            )
            manifest = read_manifest(s3, BUCKET, loaded["root"])
            dest.mkdir(parents=True, exist_ok=True)
            for entry in manifest["objects"]:
                s3.download_file(BUCKET, loaded["root"] + entry["key"], str(dest / entry["key"]))
            (dest / "manifest.json").write_text(json.dumps(manifest))
    finally:
        os.environ.update(saved)
    return dest


if __name__ == "__main__":
    import sys

    print(digits_partition(Path(sys.argv[1])))
