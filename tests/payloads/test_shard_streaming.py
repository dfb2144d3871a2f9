"""The payload's shard reader against the real shard writer, straight from S3 (the moto server over
HTTPS): the objects and the versions the manifest lists, streamed, each image with its class name."""

from __future__ import annotations

import io
import json
import os
import subprocess
import uuid
from pathlib import Path

import boto3
import pytest
from dagrun import delete_bucket
from PIL import Image

from pcflow.dataset.manifest import read_manifest
from pcflow.dataset.shard import shard_to_s3

pytestmark = pytest.mark.stack
SIMCLR = Path(__file__).resolve().parents[2] / "examples" / "simclr"
CLASSES = ("cat", "10", "2")  # "10" sorts before "2" as text, after it as a number

READ = """
import json, sys
sys.path.insert(0, sys.argv[1])
from data import open_dataset

data = open_dataset(sys.argv[2], seed=0)
images, labels = data.eval_set(10_000)
named = sorted([round(float(x.mean()) * 255), data.classes[y]] for x, y in zip(images, labels.tolist()))
shares = [[round(float(x.mean()) * 255) for b in data.batches(0, r, 2, 4, 5) for x in b] for r in range(2)]
print(json.dumps({"reader": type(data).__name__, "named": named, "shares": shares}))
"""


def png(value: int) -> bytes:
    buf = io.BytesIO()
    Image.new("L", (6, 6), value).save(buf, format="PNG")
    return buf.getvalue()


def test_payload_streams_the_listed_versions_of_shards_from_s3(local_stack, tmp_path: Path, payload_python: Path):
    s3 = boto3.client("s3")
    for i in range(45):
        path = tmp_path / "src" / CLASSES[i % 3] / f"{i:02d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(png(5 * i))
    bucket = f"pcflow-shard-read-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    try:
        s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
        small = {"target_shard_bytes": 6000}  # several shards
        loaded = shard_to_s3(s3, str(tmp_path / "src"), bucket=bucket, prefix="ds", partition="p", **small)
        shards = read_manifest(s3, bucket, loaded["root"])["objects"]
        assert len(shards) > 3
        s3.put_object(Bucket=bucket, Key=loaded["root"] + shards[0]["key"], Body=b"a later load replaced this")
        read = subprocess.run(
            [str(payload_python), "-c", READ, str(SIMCLR), f"s3://{bucket}/{loaded['root']}"],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            env=os.environ,
        )
    finally:
        delete_bucket(s3, bucket)
    assert read.returncode == 0, read.stderr
    got = json.loads(read.stdout.strip().splitlines()[-1])
    assert got["reader"] == "ShardDataset"
    assert got["named"] == sorted([5 * i, CLASSES[i % 3]] for i in range(45)), "each image with its class"
    rank0, rank1 = got["shares"]
    assert len(rank0) == len(rank1) == 20 and not set(rank0) & set(rank1), "equal, disjoint shares"
