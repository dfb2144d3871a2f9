"""What a kept resource costs per day (the janitor's report), from what its listing shows and the dated
price table: hand-computed figures for each kind that bills, 0 for the free ones, and an unpriced one
said so rather than counted as 0. Offline, well under a second."""

from __future__ import annotations

import pytest

from pcflow.aws.kept import daily_costs
from pcflow.aws.teardown import Resource
from pcflow.prices import price_table

TABLE = price_table(region="us-east-1")
TAGS = {"pcflow:stack": "research"}


def priced(*resources: Resource) -> dict[str, tuple]:
    return {line["id"]: (line["usd_per_day"], line["basis"]) for line in daily_costs(resources, TABLE)}


def test_each_kind_that_bills_is_priced_per_day():
    lines = priced(
        Resource("instance", "i-head", TAGS, "running", {"InstanceType": "c5.2xlarge"}),
        Resource("instance", "i-spot", TAGS, "running", {"InstanceType": "g5.12xlarge", "InstanceLifecycle": "spot"}),
        Resource("instance", "i-off", TAGS, "stopped", {"InstanceType": "g5.12xlarge"}),
        Resource(
            "fsx-file-system",
            "fs-1",
            TAGS,
            "AVAILABLE",
            {
                "StorageCapacity": 2400,
                "LustreConfiguration": {"DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": 250},
            },
        ),
        Resource("nat-gateway", "nat-1", TAGS, "available"),
        Resource("elastic-ip", "eipalloc-1", TAGS, ""),
        Resource(
            "vpc-endpoint", "vpce-if", TAGS, "available", {"VpcEndpointType": "Interface", "SubnetIds": ["a", "b"]}
        ),
        Resource("vpc-endpoint", "vpce-s3", TAGS, "available", {"VpcEndpointType": "Gateway"}),
        Resource(
            "image",
            "ami-1",
            TAGS,
            "available",
            {"BlockDeviceMappings": [{"Ebs": {"SnapshotId": "snap-of-ami", "VolumeSize": 50}}]},
        ),
        Resource("snapshot", "snap-of-ami", TAGS, "completed", {"VolumeSize": 50}),
        Resource("snapshot", "snap-alone", TAGS, "completed", {"VolumeSize": 100}),
        Resource("vpc", "vpc-1", TAGS),
        Resource("pcluster-cluster", "pcflow-research-cluster", TAGS, "CREATE_COMPLETE"),
    )
    assert lines["i-head"] == (pytest.approx(0.34 * 24), "c5.2xlarge at $0.34/h")
    assert lines["i-spot"][0] == pytest.approx(5.672 * 24) and "spot instance costs less" in lines["i-spot"][1]
    assert lines["i-off"][0] == 0
    assert lines["fs-1"] == (pytest.approx(2400 * 0.21 / 730 * 24, abs=1e-4), "2400 GiB PERSISTENT_2_250")
    assert lines["nat-1"][0] == pytest.approx(1.08) and lines["eipalloc-1"][0] == pytest.approx(0.12)
    assert lines["vpce-if"][0] == pytest.approx(0.01 * 2 * 24) and lines["vpce-s3"][0] == 0
    assert lines["ami-1"][0] == pytest.approx(50 * 0.05 / 730 * 24, abs=1e-4)
    assert lines["snap-of-ami"] == (0, "counted with its image")
    assert lines["snap-alone"][0] == pytest.approx(100 * 0.05 / 730 * 24, abs=1e-4)
    assert lines["vpc-1"] == (0, "free") and lines["pcflow-research-cluster"] == (0, "free")


def test_what_the_table_cannot_price_is_said_not_counted_as_zero():
    (line,) = daily_costs([Resource("instance", "i-x", TAGS, "running", {"InstanceType": "x9.huge"})], TABLE)
    assert line["usd_per_day"] is None and line["basis"] == "x9.huge not in the price table"
    assert line["stack"] == "research"


def test_a_bucket_is_priced_by_the_bytes_it_stores_and_a_shared_one_by_its_share():
    gib = 2**30
    measured = {"Bytes": 200 * gib, "BytesSource": "CloudWatch BucketSizeBytes of 2026-11-30"}
    lines = priced(
        Resource("bucket", "data", TAGS, "", measured),
        Resource(
            "bucket", "big", TAGS, "", {"Bytes": 5 * gib, "BytesSource": "the first 5,000 objects", "AtLeast": True}
        ),
        Resource("bucket", "shared", TAGS, "", {**measured, "SharedBy": ["research", "nightly"]}),
        Resource("bucket", "denied", TAGS, "", {"SizeError": "size not read: AccessDenied"}),
    )
    per_day = 200 * 0.023 / 730 * 24  # GiB x S3 Standard per GiB-month, per day
    assert lines["data"] == (
        pytest.approx(per_day, abs=1e-4),
        "200.0 GiB in S3 Standard at $0.023/GiB-month (CloudWatch BucketSizeBytes of 2026-11-30)",
    )
    assert lines["big"][1].startswith("at least 5.0 GiB in S3 Standard")
    assert lines["shared"][0] == pytest.approx(per_day / 2, abs=1e-4) and "shared by 2 stacks" in lines["shared"][1]
    assert lines["denied"] == (None, "size not read: AccessDenied")
