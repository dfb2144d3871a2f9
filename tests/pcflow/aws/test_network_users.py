"""A stack's network shared by its runs, on the moto server (pcflow.aws.network_users): one network however
many runs use it, a run's release leaves it while another run holds a reference and deletes it with the
last one, a reference taken while a release decides is never left on a deleted network, and the janitor
keeps a network an unfinished run uses, removes the references of finished runs, then reaps it."""

from __future__ import annotations

import datetime as dt
import threading

import pytest

from pcflow.aws.janitor import run_janitor
from pcflow.aws.network import release_network, use_network
from pcflow.aws.network_spec import NetworkSpec
from pcflow.aws.network_users import (
    TAG_REFERENCES,
    NetworkLockTimeout,
    lock_key,
    network_lock,
    references,
    take_reference,
)

pytestmark = pytest.mark.stack
TTL = dt.timedelta(hours=1)


def use(aws, stack: str, bucket: str, run: str, dag_run: tuple[str, str] | None = None):
    spec = NetworkSpec(stack=stack, region="us-east-1")
    dag_run = dag_run or ("pretrain", f"manual__{run}")
    return use_network(aws.ec2, aws.s3, spec, bucket=bucket, run=run, ttl=TTL, dag_run=dag_run, waiter_delay=0)


def release(aws, stack: str, bucket: str, run: str) -> dict:
    return release_network(aws, stack=stack, bucket=bucket, run=run, pass_delay=0, lock_delay=0.05)


def test_runs_share_one_network_and_the_last_release_deletes_it(aws, stack, bucket, counts):
    first, second = use(aws, stack, bucket, "run-a"), use(aws, stack, bucket, "run-b")
    assert first.created and not second.created and first.vpc_id == second.vpc_id
    assert counts()["vpc"] == 1
    vpc = aws.ec2.describe_vpcs(VpcIds=[first.vpc_id])["Vpcs"][0]
    assert {t["Key"]: t["Value"] for t in vpc["Tags"]}[TAG_REFERENCES] == bucket
    assert "pcflow:run" not in {t["Key"] for t in vpc["Tags"]}  # the stack's, no run's

    kept = release(aws, stack, bucket, "run-a")  # run-b still holds its reference: refused
    assert kept["network_deleted"] is False and kept["users"] == ["run-b"]
    assert counts()["vpc"] == 1 and counts()["subnet"] == 1
    gone = release(aws, stack, bucket, "run-b")  # the last user
    assert gone["network_deleted"] is True and set(counts().values()) == {0}
    assert references(aws.s3, bucket, stack) == []
    again = release(aws, stack, bucket, "run-b")  # a retry (or a second last user): converges, deletes nothing
    assert again["network_deleted"] is False and set(counts().values()) == {0}


def test_a_release_keeps_a_network_with_an_instance_in_it(aws, stack, bucket, counts):
    """The nightly's kept cluster: its head node is in the network when the last reference goes."""
    ids = use(aws, stack, bucket, "run-a")
    instance = aws.ec2.run_instances(
        ImageId=aws.amazon_image_id(), MinCount=1, MaxCount=1, InstanceType="t3.micro", SubnetId=ids.head_subnet_id
    )["Instances"][0]["InstanceId"]
    try:
        kept = release(aws, stack, bucket, "run-a")
        assert kept["network_deleted"] is False and kept["instances"] == [instance]
        assert counts()["vpc"] == 1
    finally:
        aws.ec2.terminate_instances(InstanceIds=[instance])
    assert release(aws, stack, bucket, "run-a")["network_deleted"] is True and counts()["vpc"] == 0


def test_a_reference_taken_while_a_release_holds_the_lock_keeps_or_recreates_the_network(aws, stack, bucket, counts):
    """The race: run-b takes its reference while run-a's release is deciding. Whichever order the two
    meet in, run-b ends with a network that exists."""
    use(aws, stack, bucket, "run-a")
    # run-a's release holds the lock (it is deciding); run-b's reference lands meanwhile, and its ensure
    # waits for the lock.
    got: dict = {}
    with network_lock(aws.s3, bucket, stack, holder="run-a"):
        take_reference(aws.s3, bucket, stack, "run-b")
        waiter = threading.Thread(target=lambda: got.update(ids=use(aws, stack, bucket, "run-b")))
        waiter.start()
        waiter.join(timeout=1.0)
        assert waiter.is_alive()  # run-b waits while the lock is held
    waiter.join(timeout=60)
    assert got["ids"].vpc_id
    # run-a's release then sees run-b's reference: the network stays for run-b.
    assert release(aws, stack, bucket, "run-a")["network_deleted"] is False
    assert aws.ec2.describe_vpcs(VpcIds=[got["ids"].vpc_id])["Vpcs"]
    # The other order: run-a's release deletes (no other reference when it looks, under the lock); run-c,
    # taking its reference after that look, creates the network again instead of using a deleted one.
    assert release(aws, stack, bucket, "run-b")["network_deleted"] is True and counts()["vpc"] == 0
    again = use(aws, stack, bucket, "run-c")
    assert again.created and aws.ec2.describe_vpcs(VpcIds=[again.vpc_id])["Vpcs"]
    assert release(aws, stack, bucket, "run-c")["network_deleted"] is True


def test_concurrent_first_runs_make_one_network(aws, stack, bucket, counts):
    """Two runs start at once on a stack with no network: the lock makes one of them create it, the other adopt it."""
    results: dict = {}
    threads = [threading.Thread(target=lambda r=r: results.update({r: use(aws, stack, bucket, r)})) for r in "ab"]
    [t.start() for t in threads]
    [t.join(timeout=120) for t in threads]
    assert results["a"].vpc_id == results["b"].vpc_id and counts()["vpc"] == 1
    assert sorted(ids.created for ids in results.values()) == [False, True]
    assert [r["network_deleted"] for r in (release(aws, stack, bucket, "a"), release(aws, stack, bucket, "b"))] == [
        False,
        True,
    ]


def test_the_lock_is_one_holder_at_a_time_and_a_retry_takes_its_own_over(aws, stack, bucket):
    with network_lock(aws.s3, bucket, stack, holder="run-a"):
        with pytest.raises(NetworkLockTimeout, match=lock_key(stack)):
            with network_lock(aws.s3, bucket, stack, holder="run-b", timeout=0.1, delay=0.05):
                pass
        with network_lock(aws.s3, bucket, stack, holder="run-a", timeout=0):  # a retry of run-a: its own
            pass
    with network_lock(aws.s3, bucket, stack, holder="run-b", timeout=0):  # released: free
        pass


def test_the_janitor_keeps_a_network_an_unfinished_run_uses_then_reaps_it(aws, stack, bucket, counts):
    use(aws, stack, bucket, "run-live", dag_run=("pretrain", "live"))
    use(aws, stack, bucket, "run-gone", dag_run=("pretrain", "gone"))  # ended without its teardown
    states = {"live": "running", "gone": "failed"}
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=2)  # every network resource has expired

    def janitor(dry_run: bool):
        state = lambda dag_id, run_id: states[run_id]  # noqa: E731 - what Airflow answers
        return run_janitor(aws, stack=stack, now=later, run_state=state, dry_run=dry_run, pass_delay=0)

    assert janitor(dry_run=False).deleted == []  # run "live" is running: nothing of the network goes
    assert counts()["vpc"] == 1
    assert [ref.run for ref in references(aws.s3, bucket, stack)] == ["run-live"]  # the stale one removed
    states["live"] = "success"
    dry = janitor(dry_run=True)  # would reap the network now, and removes nothing
    assert {r.kind for r in dry.would_delete} >= {"vpc"} and counts()["vpc"] == 1
    assert len(references(aws.s3, bucket, stack)) == 1
    report = janitor(dry_run=False)
    assert {r.kind for r in report.deleted} >= {"vpc", "subnet"} and set(counts().values()) == {0}
    assert references(aws.s3, bucket, stack) == []
