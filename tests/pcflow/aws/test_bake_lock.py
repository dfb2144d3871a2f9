"""Runs that start at once on one stack, on the moto server: the shared S3 lock (pcflow.aws.locks) and the
recipe's bake lock built on it. Two runs that find no image bake it once: the second waits for the lock in
the triggerer (LockReleasedTrigger), then adopts the first's image. A stale lock is broken, a live one is
not; a release by a run that does not hold the lock is refused; the trigger fires on release and on a
change of hands, and not before. The network task waits for the stack's network lock the same way."""

from __future__ import annotations

import datetime as dt
import threading
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import TaskDeferred
from taskcontext import drive, first_event, roundtrip

from pcflow.aws.ami import AmiSpec, BakeImageOperator, BakeLocking, bake_image, bake_lock_key
from pcflow.aws.locks import LockNotHeld, S3Lock
from pcflow.aws.network import EnsureNetworkOperator, ReleaseNetworkOperator, ensure_network, release_network
from pcflow.aws.network_spec import NetworkSpec
from pcflow.aws.network_users import lock_key, network_lock, references
from pcflow.aws.waits import LockReleasedTrigger
from pcflow.naming import run_key_from_context
from pcflow.paths import include_dir

pytestmark = pytest.mark.stack

HOUR = dt.timedelta(hours=1)
CONNECTION = {"aws_conn_id": "aws_default", "region_name": "us-east-1"}
RECIPE = "0123456789abcdef"


def context(run_id: str) -> dict:
    return {"ti": SimpleNamespace(dag_id="pretrain", run_id=run_id, map_index=-1, try_number=1)}


def builders(aws, stack: str) -> int:
    """Builder instances ever launched for the stack (terminated ones included)."""
    found = aws.ec2.describe_instances(Filters=[{"Name": "tag:pcflow:role", "Values": ["builder"]}])
    mine = [i for r in found["Reservations"] for i in r["Instances"]]
    return sum(1 for i in mine if {"Key": "pcflow:stack", "Value": stack} in i.get("Tags", []))


@pytest.fixture
def profile(aws, stack):
    name = f"pcflow-lock-{stack}"
    aws.iam.create_instance_profile(InstanceProfileName=name)
    yield name
    aws.iam.delete_instance_profile(InstanceProfileName=name)


@pytest.fixture
def subnet(aws, stack) -> str:
    return ensure_network(aws.ec2, NetworkSpec(stack=stack, region="us-east-1"), waiter_delay=0).head_subnet_id


def lock(aws, bucket: str, holder: str, stale_after: dt.timedelta = HOUR) -> S3Lock:
    return S3Lock(aws.s3, bucket, bake_lock_key("tlocks", RECIPE), holder=holder, why="a test", stale_after=stale_after)


def test_two_runs_at_once_bake_once_the_second_defers_then_adopts(aws, stack, bucket, profile, subnet, counts):  # noqa: PLR0917
    def bake_op() -> BakeImageOperator:
        return BakeImageOperator(
            task_id="image",
            stack=stack,
            pcluster_version="3.16.1",
            bootstrap_script_path=str(include_dir() / "ami" / "bootstrap.sh"),
            instance_profile=profile,
            subnet_id=subnet,
            instance_type="t3.micro",
            base_image_id=aws.amazon_image_id(),
            waiter_delay=0,
            deferrable=True,
            lock_bucket=bucket,
        )

    first, second = context("manual__first"), context("manual__second")
    baker, waiter = bake_op(), bake_op()
    with pytest.raises(TaskDeferred) as baking:
        baker.execute(first)  # holds the recipe's lock; its builder runs the bootstrap
    assert baking.value.trigger.waiter_name == "command_executed"
    with pytest.raises(TaskDeferred) as waiting:
        waiter.execute(second)  # no image yet, the lock held: it waits in the triggerer, not in a slot
    assert waiting.value.method_name == "lock_released"
    trigger = roundtrip(waiting.value.trigger)
    assert isinstance(trigger, LockReleasedTrigger)
    assert trigger.serialize()[1]["holder"] == run_key_from_context(first)
    _, kwargs = trigger.serialize()
    assert first_event(LockReleasedTrigger(**{**kwargs, "waiter_max_attempts": 2}))["status"] == "error"  # held

    baked, _ = drive(baker, first, baking.value)
    assert baked["reused"] is False
    event = first_event(trigger, timeout=60)  # the baker released the lock
    assert event["status"] == "success"
    adopted = waiter.lock_released(second, event)
    assert adopted == {**baked, "reused": True}
    assert builders(aws, stack) == 1 and counts()["image"] == 1 and counts()["instance"] == 0
    key = bake_lock_key(stack, baked["recipe_hash"])
    assert aws.s3.list_objects_v2(Bucket=bucket, Prefix=key).get("KeyCount") == 0  # released


def test_two_bakes_waiting_in_their_workers_make_one_image(aws, stack, bucket, profile, subnet, counts):  # noqa: PLR0917
    spec = AmiSpec(
        stack=stack,
        region="us-east-1",
        pcluster_version="3.16.1",
        bootstrap_script="#!/bin/bash\ntrue\n",
        instance_profile=profile,
        subnet_id=subnet,
        instance_type="t3.micro",
        base_image_id=aws.amazon_image_id(),
    )
    start, results, errors = threading.Barrier(2), {}, []

    def bake(run: str) -> None:
        locking = BakeLocking(aws.s3, bucket, run, delay=0.05)
        start.wait()
        try:
            results[run] = bake_image(aws.ec2, aws.ssm, spec, waiter_delay=0, attempt=f"{run}/1", locking=locking)
        except Exception as error:  # the test's own thread: reported below
            errors.append(error)

    threads = [threading.Thread(target=bake, args=(run,)) for run in ("run-a", "run-b")]
    [t.start() for t in threads]
    [t.join(timeout=300) for t in threads]
    assert not errors and len(results) == 2
    assert sorted(r["reused"] for r in results.values()) == [False, True]
    assert len({r["image_id"] for r in results.values()}) == 1
    assert builders(aws, stack) == 1 and counts()["image"] == 1


def test_a_stale_lock_is_broken_and_a_live_one_is_not(aws, bucket):
    dead = lock(aws, bucket, "run-dead")
    assert dead.try_acquire() is None
    found = lock(aws, bucket, "run-b").try_acquire()  # live (younger than its stale age): kept
    assert found is not None and found.holder == "run-dead"
    breaker = lock(aws, bucket, "run-b", stale_after=dt.timedelta(0))  # the same lock once its age has passed
    assert breaker.try_acquire() is None and breaker.holding().holder == "run-b"
    with pytest.raises(LockNotHeld, match="held by run-b"):
        dead.release()  # the dead run's late release leaves the new holder's lock
    assert breaker.holding().holder == "run-b"
    breaker.release()
    assert breaker.holding() is None


def test_only_the_holder_releases_and_a_retry_takes_its_own_over(aws, bucket):
    holder, other = lock(aws, bucket, "run-a"), lock(aws, bucket, "run-b")
    assert holder.try_acquire() is None
    with pytest.raises(LockNotHeld, match="held by run-a"):
        other.release()
    assert holder.holding().holder == "run-a"
    before = holder.holding().etag
    retry = lock(aws, bucket, "run-a")  # the same run's next try, after its worker died
    assert retry.try_acquire() is None and retry.holding().etag != before
    retry.release()
    assert holder.holding() is None
    holder.release()  # already released: nothing to do


def test_the_trigger_fires_on_release_and_on_a_change_of_hands_only(aws, bucket):
    holder, waiting = lock(aws, bucket, "run-a"), lock(aws, bucket, "run-b")
    assert holder.try_acquire() is None

    def wait_trigger(**bound):
        found = waiting.try_acquire()
        trigger = waiting.released_trigger(found, waiter_delay=0, **CONNECTION)
        _, kwargs = trigger.serialize()
        return roundtrip(trigger), LockReleasedTrigger(**{**kwargs, **bound})

    trigger, bounded = wait_trigger(waiter_max_attempts=2)
    held = first_event(bounded)
    assert held["status"] == "error" and held["lock"]["holder"] == "run-a"  # still held: bounded, no release
    holder.release()
    released = first_event(trigger, timeout=60)
    assert released == {"status": "success", "lock": {"bucket": bucket, "key": holder.key, "holder": "run-a"}}

    assert holder.try_acquire() is None
    trigger, _ = wait_trigger()
    assert lock(aws, bucket, "run-c", stale_after=dt.timedelta(0)).try_acquire() is None  # broken, taken by run-c
    assert first_event(trigger, timeout=60)["status"] == "success"


def test_the_network_task_waits_for_the_network_lock_in_the_triggerer(aws, stack, bucket, counts):
    op = EnsureNetworkOperator(
        task_id="network", stack=stack, references_bucket=bucket, waiter_delay=0, deferrable=True
    )
    run = context("manual__net")
    with network_lock(aws.s3, bucket, stack, holder="run-other"):  # another run is creating or deleting it
        with pytest.raises(TaskDeferred) as deferred:
            op.execute(run)
        assert deferred.value.method_name == "lock_released"
        assert [ref.run for ref in references(aws.s3, bucket, stack)] == [run_key_from_context(run)]
        assert counts()["vpc"] == 0
    ids, waits = drive(op, run, deferred.value)
    assert waits == ["LockReleased"] and ids["vpc_id"] and counts()["vpc"] == 1
    assert aws.s3.list_objects_v2(Bucket=bucket, Prefix=lock_key(stack)).get("KeyCount") == 0
    gone = release_network(aws, stack=stack, bucket=bucket, run=run_key_from_context(run), pass_delay=0)
    assert gone["network_deleted"] is True and counts()["vpc"] == 0


def test_the_last_user_s_release_waits_for_the_network_lock_in_the_triggerer(aws, stack, bucket, counts):
    """The teardown side of the lock: the last run giving the network back finds another run holding the
    lock (a new run creating it again, say) and defers instead of holding a worker slot; back from the
    wait it deletes the network under the lock, and leaves the lock free."""
    run = context("manual__last")
    ensure = EnsureNetworkOperator(task_id="network", stack=stack, references_bucket=bucket, deferrable=True)
    ensure.execute(run)
    release = ReleaseNetworkOperator(
        task_id="release_network", stack=stack, references_bucket=bucket, waiter_delay=0, pass_delay=0, deferrable=True
    )
    with network_lock(aws.s3, bucket, stack, holder="run-other"):
        with pytest.raises(TaskDeferred) as deferred:
            release.execute(run)
        assert deferred.value.method_name == "lock_released"
        assert references(aws.s3, bucket, stack) == [] and counts()["vpc"] == 1  # given back; not yet deleted
    report, waits = drive(release, run, deferred.value)
    assert waits == ["LockReleased"] and report["network_deleted"] is True and counts()["vpc"] == 0
    assert aws.s3.list_objects_v2(Bucket=bucket, Prefix=lock_key(stack)).get("KeyCount") == 0
