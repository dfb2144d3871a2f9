"""shard mode against the moto server: every sample read back equals its source; re-runs upload nothing."""

from __future__ import annotations

import io

import pytest

from pcflow.dataset.digits import materialize_digits
from pcflow.dataset.manifest import read_manifest
from pcflow.dataset.shard import shard_to_s3

pytestmark = pytest.mark.stack


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    return materialize_digits(tmp_path_factory.mktemp("digits"))


def test_shard_round_trip_every_sample_equals_its_source(s3, bucket, counter, digits):
    result = shard_to_s3(
        s3,
        str(digits),
        bucket=bucket,
        prefix="ds/digits",
        partition="v1",
        target_shard_bytes=400_000,
        shuffle_seed=7,
        workers=4,
    )
    manifest = read_manifest(s3, bucket, "ds/digits/v1/")
    assert manifest["classes"] == [str(i) for i in range(10)]
    assert result["samples"] == manifest["samples"] == 1797
    assert result["object_count"] == len(manifest["objects"]) > 1

    from pcflow.dataset.shard import read_shard

    seen = {}
    order = []
    for obj in manifest["objects"]:
        body = s3.get_object(Bucket=bucket, Key=manifest["root"] + obj["key"])["Body"].read()
        import hashlib

        assert hashlib.sha256(body).hexdigest() == obj["sha256"]
        samples = list(read_shard(io.BytesIO(body)))
        assert len(samples) == obj["samples"]
        for sample in samples:
            seen[sample["__key__"]] = sample
            order.append(sample["__key__"])
    files = sorted(digits.rglob("*.png"))
    assert len(seen) == len(files) == 1797
    for path in files:
        key = f"{path.parent.name}/{path.stem}"
        assert seen[key]["png"] == path.read_bytes()
        assert manifest["classes"][int(seen[key]["cls"])] == path.parent.name
    assert order != sorted(order), "shuffled with the fixed seed"

    counter.reset()
    again = shard_to_s3(
        s3,
        str(digits),
        bucket=bucket,
        prefix="ds/digits",
        partition="v1",
        target_shard_bytes=400_000,
        shuffle_seed=7,
        workers=4,
    )
    assert counter.calls["PutObject"] == 0 and again["uploaded"] == 0
    assert again["content_hash"] == result["content_hash"], "shards are byte-for-byte deterministic"


def test_changed_sample_replaces_only_its_shard_and_prunes_the_old_one(s3, bucket, counter, tmp_path):
    src = tmp_path / "src"
    for label in ("cat", "dog"):
        for i in range(30):
            path = src / label / f"{label}{i:02d}.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{label} {i}\n")
    kwargs = {"bucket": bucket, "prefix": "ds", "partition": "p", "target_shard_bytes": 10 * 1024, "shuffle_seed": None}
    before = read_keys = shard_to_s3(s3, str(src), **kwargs)
    old = {o["key"] for o in read_manifest(s3, bucket, "ds/p/")["objects"]}
    (src / "dog" / "dog05.txt").write_text("dog X\n")  # same size, other bytes: one shard changes
    counter.reset()
    after = shard_to_s3(s3, str(src), **kwargs)
    new = {o["key"] for o in read_manifest(s3, bucket, "ds/p/")["objects"]}
    assert len(counter.data_puts()) == 1 and len(new - old) == 1
    assert after["content_hash"] != before["content_hash"] and read_keys["object_count"] == after["object_count"]
    listed = {o["Key"].removeprefix("ds/p/") for o in s3.list_objects_v2(Bucket=bucket, Prefix="ds/p/")["Contents"]}
    assert listed == new | {"manifest.json"}, "the superseded shard is pruned after the commit"
