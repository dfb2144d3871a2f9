"""A kept bucket's size against the moto server: CloudWatch's daily `BucketSizeBytes` when it has a
datapoint, else a bounded listing ("at least" past its bound); a shared bucket as one line per stack
using it. moto's CloudWatch publishes no S3 storage metrics, so the CloudWatch test puts the datapoint
into it itself, shaped as S3 publishes it (namespace AWS/S3, dimensions BucketName and
StorageType=StandardStorage, unit Bytes, one datapoint a day stamped at midnight UTC). Each test makes its
own uniquely named buckets and deletes them: about a second each."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from pcflow.aws import kept_buckets as sizes
from pcflow.aws.buckets import register_bucket_user
from pcflow.aws.janitor import kept_report
from pcflow.aws.kept_buckets import kept_buckets
from pcflow.naming import aws_tags, shared_tags, standard_tags

pytestmark = pytest.mark.stack
NOW = dt.datetime.now(dt.UTC)


@pytest.fixture
def make_bucket(aws):
    made = []

    def make(tags: dict[str, str], objects: int = 0, size: int = 0) -> str:
        name = f"pcflow-t{uuid.uuid4().hex[:12]}"
        aws.s3.create_bucket(Bucket=name)
        aws.s3.put_bucket_tagging(Bucket=name, Tagging={"TagSet": aws_tags(tags)})
        for i in range(objects):
            aws.s3.put_object(Bucket=name, Key=f"shards/{i:04d}.tar", Body=b"x" * size)
        made.append(name)
        return name

    yield make
    for name in made:
        for item in aws.s3.list_objects_v2(Bucket=name).get("Contents", []):
            aws.s3.delete_object(Bucket=name, Key=item["Key"])
        aws.s3.delete_bucket(Bucket=name)


def of(resources, bucket):
    return [r for r in resources if r.id == bucket]


def test_without_a_datapoint_a_bucket_is_listed_and_past_the_bound_sized_at_least(aws, stack, make_bucket, monkeypatch):
    bucket = make_bucket(standard_tags(stack=stack, component="dataset"), objects=5, size=1000)
    [whole] = of(kept_buckets(aws, "us-east-1", stack, NOW), bucket)
    assert whole.tags["pcflow:stack"] == stack
    assert whole.detail["Bytes"] == 5000 and not whole.detail["AtLeast"], whole.detail
    assert whole.detail["BytesSource"] == "5 object(s) listed (current versions), no CloudWatch datapoint"
    monkeypatch.setattr(sizes, "PAGE_SIZE", 2)
    monkeypatch.setattr(sizes, "MAX_LIST_PAGES", 2)  # reads 4 of the 5 objects
    [bounded] = of(kept_buckets(aws, "us-east-1", stack, NOW), bucket)
    assert bounded.detail["Bytes"] == 4000 and bounded.detail["AtLeast"]
    [line] = kept_report([bounded], "us-east-1")["kept"]
    assert (
        line["basis"].startswith("at least 4,000 bytes in S3 Standard")
        and "the first 4 object(s) listed" in line["basis"]
    )


def test_the_daily_cloudwatch_datapoint_is_the_size_when_there_is_one(aws, stack, make_bucket):
    bucket = make_bucket(standard_tags(stack=stack, component="dataset"), objects=1, size=10)
    midnight = NOW.replace(hour=0, minute=0, second=0, microsecond=0)
    for day, size in ((2, 100 * 2**30), (1, 300 * 2**30)):  # as S3 publishes: once a day, the newest last
        aws.cloudwatch.put_metric_data(
            Namespace="AWS/S3",
            MetricData=[
                {
                    "MetricName": "BucketSizeBytes",
                    "Dimensions": [
                        {"Name": "BucketName", "Value": bucket},
                        {"Name": "StorageType", "Value": "StandardStorage"},
                    ],
                    "Timestamp": midnight - dt.timedelta(days=day),
                    "Value": float(size),
                    "Unit": "Bytes",
                }
            ],
        )
    [resource] = of(kept_buckets(aws, "us-east-1", stack, NOW), bucket)
    day = (midnight - dt.timedelta(days=1)).date().isoformat()
    assert resource.detail == {
        "Bytes": 300 * 2**30,
        "BytesSource": f"CloudWatch BucketSizeBytes of {day}",
        "AtLeast": False,
    }
    [line] = kept_report([resource], "us-east-1")["kept"]
    assert line["usd_per_day"] == pytest.approx(300 * 0.023 / 730 * 24, abs=1e-4)  # $0.23 per day


def test_a_shared_bucket_is_a_line_for_each_stack_using_it_with_its_share(aws, stack, make_bucket):
    other = f"{stack}-b"
    bucket = make_bucket(shared_tags(created_by=stack, component="dataset"), objects=2, size=500)
    for user in (stack, other):
        register_bucket_user(aws.s3, bucket, user)
    every = of(kept_buckets(aws, "us-east-1", None, NOW), bucket)
    assert sorted(r.tags["pcflow:stack"] for r in every) == sorted([stack, other])
    assert {tuple(r.detail["SharedBy"]) for r in every} == {tuple(sorted([stack, other]))}
    [mine] = of(kept_buckets(aws, "us-east-1", stack, NOW), bucket)
    listed = sum(item["Size"] for item in aws.s3.list_objects_v2(Bucket=bucket)["Contents"])  # shards and markers
    assert mine.tags["pcflow:stack"] == stack and mine.detail["Bytes"] == every[0].detail["Bytes"] == listed
    lines = kept_report(every, "us-east-1")["kept"]
    assert all("shared by 2 stacks" in line["basis"] for line in lines)
    assert not of(kept_buckets(aws, "us-east-1", f"{stack}-c", NOW), bucket)  # a stack that does not use it


def test_the_local_stack_s_s3_metric_is_the_bytes_s3_would_bill_from_the_day_after_creation(monkeypatch):
    """The moto stand-in (include/local/moto_standins.py), in process (moto's mock, not the stack's
    server): every version and upload part in S3 Standard, not moto's memory size of its objects; no
    datapoint for a bucket created today."""
    import boto3
    from moto import mock_aws
    from moto.s3.models import s3_backends
    from moto_standins import s3_cloudwatch_metrics

    for variable in ("AWS_ENDPOINT_URL", "AWS_CA_BUNDLE"):  # the mock answers AWS's own endpoints only
        monkeypatch.delenv(variable, raising=False)
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        for name in ("pcflow-old", "pcflow-new"):
            s3.create_bucket(Bucket=name)
        s3.put_bucket_versioning(Bucket="pcflow-old", VersioningConfiguration={"Status": "Enabled"})
        for body in (b"x" * 1000, b"x" * 500):  # two versions of one key: both bill
            s3.put_object(Bucket="pcflow-old", Key="a", Body=body)
        s3.put_object(Bucket="pcflow-old", Key="cold", Body=b"x" * 7, StorageClass="GLACIER")
        s3.delete_object(Bucket="pcflow-old", Key="a")  # a delete marker holds no bytes
        upload = s3.create_multipart_upload(Bucket="pcflow-old", Key="m")["UploadId"]
        s3.upload_part(Bucket="pcflow-old", Key="m", UploadId=upload, PartNumber=1, Body=b"y" * 300)
        account = boto3.client("sts", region_name="us-east-1").get_caller_identity()["Account"]
        s3_backends[account]["aws"].buckets["pcflow-old"].creation_date -= dt.timedelta(days=2)
        sizes_of = {
            {d.name: d.value for d in m.dimensions}["BucketName"]: m.value
            for m in s3_cloudwatch_metrics(account, "us-east-1")
            if m.name == "BucketSizeBytes"
        }
    assert sizes_of == {"pcflow-old": 1000 + 500 + 300}
