"""The janitor against the moto server: a run killed before its teardown is reaped; live and shared
resources are not. Scoped to the test's stack, because the moto server is shared with other tests."""

from __future__ import annotations

import datetime as dt

import pytest

from pcflow.aws.janitor import JanitorOperator, run_janitor
from pcflow.aws.network import ensure_network
from pcflow.aws.network_spec import NetworkSpec
from pcflow.aws.tags import tag_specifications
from pcflow.naming import standard_tags

pytestmark = pytest.mark.stack
NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)


def killed_run(aws, stack: str, run: str, *, ttl: dt.timedelta | None) -> None:
    """What a run leaves when its worker is killed before the teardown task: network + an instance."""
    ids = ensure_network(aws.ec2, NetworkSpec(stack=stack, region="us-east-1"), run=run, ttl=ttl, waiter_delay=0)
    image = aws.amazon_image_id()
    tags = standard_tags(stack=stack, component="cluster", run=run, ttl=ttl)
    aws.ec2.run_instances(
        ImageId=image,
        MinCount=1,
        MaxCount=1,
        InstanceType="t3.micro",
        SubnetId=ids.head_subnet_id,
        TagSpecifications=tag_specifications("instance", tags),
    )


def test_janitor_reaps_a_killed_run_and_keeps_the_live_one(aws, stack, counts):
    expired_ttl = dt.timedelta(hours=-1)  # expires = an hour before now
    killed_run(aws, stack, "run-killed", ttl=expired_ttl)
    live = f"{stack}-live"
    killed_run(aws, live, "run-live", ttl=dt.timedelta(days=1))
    try:
        dry = run_janitor(aws, stack=stack, dry_run=True, pass_delay=0)
        assert {r.kind for r in dry.would_delete} >= {"instance", "vpc", "subnet"}
        assert counts()["vpc"] == 1  # dry run deleted nothing
        report = run_janitor(aws, stack=stack, dry_run=False, pass_delay=0)
        assert report.complete and set(counts().values()) == {0}
        kept = run_janitor(aws, stack=live, dry_run=False, pass_delay=0)
        assert kept.deleted == []
        assert aws.ec2.describe_vpcs(Filters=[{"Name": "tag:pcflow:stack", "Values": [live]}])["Vpcs"]
        # Once its expiry has passed, it is reaped too (it names no DAG run: expiry alone decides).
        later = dt.datetime.now(dt.UTC) + dt.timedelta(days=2)
        gone = run_janitor(aws, stack=live, now=later, dry_run=False, pass_delay=0)
        assert {r.kind for r in gone.deleted} >= {"instance", "vpc"}
    finally:
        from pcflow.aws.teardown import Selector, teardown

        teardown(aws, Selector(stack=live), pass_delay=0, raise_on_leftovers=False)


class _DagRun:
    def __init__(self, run_type: str):
        self.run_type = run_type


def test_operator_is_dry_run_when_triggered_by_hand(aws, stack, counts):
    killed_run(aws, stack, "run-killed", ttl=dt.timedelta(hours=-1))
    manual = JanitorOperator(task_id="janitor", stack=stack, pass_delay=0)
    out = manual.execute({"dag_run": _DagRun("manual")})
    assert out["dry_run"] is True and out["would_delete"] and counts()["vpc"] == 1
    scheduled = JanitorOperator(task_id="janitor", stack=stack, pass_delay=0)
    out = scheduled.execute({"dag_run": _DagRun("scheduled")})
    assert out["dry_run"] is False and out["remaining"] == [] and set(counts().values()) == {0}


def test_the_report_lists_what_it_keeps_with_its_cost_per_day(aws, stack):
    """A live run (kept: not expired, run alive) with a NAT gateway, an instance and a Lustre file system:
    the janitor leaves them and its report prices each per day from the us-east-1 table (as of
    2026-11-01); the VPC and its parts are free."""
    spec = NetworkSpec(stack=stack, region="us-east-1", private_subnet_cidrs=["10.42.128.0/18"], nat_gateway=True)
    ids = ensure_network(aws.ec2, spec, run="run-live", ttl=dt.timedelta(days=1), waiter_delay=0)
    tags = standard_tags(stack=stack, component="cluster", run="run-live", ttl=dt.timedelta(days=1))
    aws.ec2.run_instances(
        ImageId=aws.amazon_image_id(),
        MinCount=1,
        MaxCount=1,
        InstanceType="t3.micro",
        SubnetId=ids.head_subnet_id,
        TagSpecifications=tag_specifications("instance", tags),
    )
    fs_id = aws.fsx.create_file_system(
        FileSystemType="LUSTRE",
        StorageCapacity=1200,
        SubnetIds=[ids.head_subnet_id],
        LustreConfiguration={"DeploymentType": "SCRATCH_2"},
        Tags=[{"Key": k, "Value": v} for k, v in tags.items()],
    )["FileSystem"]["FileSystemId"]
    bucket = f"pcflow-{stack}-data"  # the janitor never deletes a bucket: it is kept, priced by its bytes
    aws.s3.create_bucket(Bucket=bucket)
    aws.s3.put_bucket_tagging(Bucket=bucket, Tagging={"TagSet": [{"Key": k, "Value": v} for k, v in tags.items()]})
    aws.s3.put_object(Bucket=bucket, Key="shard-0000.tar", Body=b"x" * 4096)
    try:
        out = JanitorOperator(task_id="janitor", stack=stack, pass_delay=0).execute({"dag_run": _DagRun("manual")})
        assert out["would_delete"] == []  # all of it is kept: the run is alive and has not expired
        [kept_bucket] = [line for line in out["kept"] if line["kind"] == "bucket"]
        assert kept_bucket["id"] == bucket and kept_bucket["basis"].startswith("4,096 bytes in S3 Standard")
        per_day = {line["kind"]: line["usd_per_day"] for line in out["kept"]}
        assert per_day["instance"] == pytest.approx(0.0104 * 24)  # t3.micro
        assert per_day["fsx-file-system"] == pytest.approx(1200 * 0.14 / 730 * 24, abs=1e-4)  # $5.52
        assert per_day["nat-gateway"] == pytest.approx(0.045 * 24)
        assert per_day["elastic-ip"] == pytest.approx(0.005 * 24)
        assert per_day["vpc"] == per_day["subnet"] == 0
        assert per_day["bucket"] == pytest.approx(4096 / 2**30 * 0.023 / 730 * 24, abs=1e-4)
        assert out["kept_usd_per_day"] == pytest.approx(sum(per_day.values()), abs=0.01)
        assert out["kept_unpriced"] == 0 and out["prices"] == "prices: us-east-1 price table as of 2026-11-01"
    finally:
        aws.fsx.delete_file_system(FileSystemId=fs_id)
        aws.s3.delete_object(Bucket=bucket, Key="shard-0000.tar")
        aws.s3.delete_bucket(Bucket=bucket)
