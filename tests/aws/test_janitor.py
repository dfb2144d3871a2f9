"""The janitor against the moto server: a run killed before its teardown is reaped; live and shared
resources are not. Scoped to the test's stack, because the moto server is shared with other tests."""

from __future__ import annotations

import datetime as dt

import pytest

from pcflow.aws.janitor import JanitorOperator, reapable, run_janitor
from pcflow.aws.network import NetworkSpec, ensure_network
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
        ImageId=image, MinCount=1, MaxCount=1, InstanceType="t3.micro", SubnetId=ids.head_subnet_id,
        TagSpecifications=tag_specifications("instance", tags),
    )  # fmt: skip


def test_rule_expired_or_inactive_run_but_never_shared():
    rule = reapable(NOW, active_run_keys={"alive"})
    assert rule({"pcflow:expires": "2026-11-29T11:00:00Z", "pcflow:run": "alive"})
    assert rule({"pcflow:expires": "never", "pcflow:run": "dead"})
    assert not rule({"pcflow:expires": "2026-11-29T13:00:00Z", "pcflow:run": "alive"})
    assert not rule({"pcflow:expires": "never"})  # shared network/AMI
    assert not rule({"pcflow:expires": "garbage", "pcflow:run": "dead"})  # unreadable: left alone
    assert not reapable(NOW)({"pcflow:expires": "never", "pcflow:run": "dead"})  # no run list: expiry only


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
        # Once the live run is no longer active, it is reaped too.
        gone = run_janitor(aws, stack=live, active_run_keys=[], dry_run=False, pass_delay=0)
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
