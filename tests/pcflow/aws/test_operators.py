"""The operators on the moto server through the `aws_default` connection: XCom shapes, deferral."""

from __future__ import annotations

import dataclasses

import pytest
import taskcontext
from airflow.sdk.exceptions import TaskDeferred
from taskcontext import first_event

from pcflow.aws.ami import BakeImageOperator, BakeWait
from pcflow.aws.network import DeleteNetworkOperator, EnsureNetworkOperator
from pcflow.aws.teardown import TeardownOperator
from pcflow.paths import include_dir

pytestmark = pytest.mark.stack


class _TI:
    dag_id, run_id, map_index = "pretrain", "manual__2026-11-29T18:00:00+00:00", -1
    try_number = 1


def test_network_operators_return_ids_and_tear_down(aws, stack, counts):
    ensure = EnsureNetworkOperator(
        task_id="network", stack=stack, network={"ssh_ingress_cidrs": ["203.0.113.0/24"]}, waiter_delay=0
    )
    ids = ensure.execute({"ti": _TI()})
    assert ensure.ec2.meta.config.retries["mode"] == "standard"
    assert set(ids) >= {"vpc_id", "head_subnet_id", "compute_subnet_ids", "head_security_group_id"}
    assert ids["compute_subnet_ids"] == [ids["head_subnet_id"]]
    dry = TeardownOperator(task_id="teardown", stack=stack, dry_run=True).execute({})
    assert len(dry["would_delete"]) == 7 and counts()["vpc"] == 1
    out = DeleteNetworkOperator(task_id="delete", stack=stack, pass_delay=0).execute({"ti": _TI()})
    assert out["remaining"] == [] and set(counts().values()) == {0}


def roundtrip(trigger):
    """The trigger as the triggerer builds it: one of pcflow's AWS triggers."""
    rebuilt = taskcontext.roundtrip(trigger)
    assert type(rebuilt).__module__ == "pcflow.aws.waits"
    return rebuilt


def retrying(trigger):
    """The trigger as the triggerer builds it, from an operator: on the operator's retrying connection."""
    rebuilt = roundtrip(trigger)
    assert rebuilt.serialize()[1]["botocore_config"]["retries"]["mode"] == "standard"
    return rebuilt


def test_bake_operator_defers_every_wait_and_a_retry_resumes(aws, stack, counts):
    ids = EnsureNetworkOperator(task_id="network", stack=stack, waiter_delay=0).execute({"ti": _TI()})
    script = include_dir() / "ami" / "bootstrap.sh"  # bootstrap scripts come from include/ami/ only
    base = aws.amazon_image_id()
    profile = f"pcflow-op-{stack}"
    aws.iam.create_instance_profile(InstanceProfileName=profile)
    try:

        def bake_op() -> BakeImageOperator:
            return BakeImageOperator(
                task_id="ami",
                stack=stack,
                pcluster_version="3.16.1",
                bootstrap_script_path=str(script),
                instance_profile=profile,
                subnet_id=ids["head_subnet_id"],
                instance_type="t3.micro",
                base_image_id=base,
                waiter_delay=0,
                deferrable=True,
            )

        with pytest.raises(TaskDeferred) as first:
            bake_op().execute({"ti": _TI()})
        assert first.value.trigger.waiter_name == "command_executed"  # builder up, agent online, script sent
        # The worker died during that wait; the retry finds the builder and its command, and resumes after them.
        op = bake_op()
        with pytest.raises(TaskDeferred) as retried:
            op.execute({"ti": _TI()})
        result, waits = taskcontext.drive(op, {"ti": _TI()}, retried.value, rebuild=retrying)
        assert waits == ["instance_stopped", "image_available"]
        assert result["reused"] is False and counts()["instance"] == 0 and counts()["image"] == 1
        builders = aws.ec2.describe_instances(Filters=[{"Name": "tag:pcflow:stack", "Values": [stack]}])
        assert sum(len(r["Instances"]) for r in builders["Reservations"]) == 1
        (instance_id,) = [i["InstanceId"] for r in builders["Reservations"] for i in r["Instances"]]
        sent = aws.ssm.list_commands(InstanceId=instance_id)["Commands"]
        assert [c["Comment"] for c in sent] == [f"pcflow bootstrap {result['recipe_hash']}"]
        # Next run: the recipe's image exists, nothing is deferred or launched.
        assert op.execute({"ti": _TI()})["reused"] is True
    finally:
        aws.iam.delete_instance_profile(InstanceProfileName=profile)


def test_bake_waits_for_the_ssm_agent_in_the_triggerer(aws, stack):
    """The agent wait as a trigger: Online for a builder launched with an instance profile (the stand-in's
    managed node), an error event for an instance no agent registers."""
    subnet = EnsureNetworkOperator(task_id="network", stack=stack, waiter_delay=0).execute({"ti": _TI()})
    profile = f"pcflow-agent-{stack}"
    aws.iam.create_instance_profile(InstanceProfileName=profile)
    tags = [{"ResourceType": "instance", "Tags": [{"Key": "pcflow:stack", "Value": stack}]}]
    launch = {"ImageId": aws.amazon_image_id(), "MinCount": 1, "MaxCount": 1, "SubnetId": subnet["head_subnet_id"]}
    try:
        managed = aws.ec2.run_instances(**launch, IamInstanceProfile={"Name": profile}, TagSpecifications=tags)
        unmanaged = aws.ec2.run_instances(**launch, TagSpecifications=tags)
        connection = {"aws_conn_id": "aws_default", "region_name": "us-east-1"}
        for reservation, status in ((managed, "success"), (unmanaged, "error")):
            instance_id = reservation["Instances"][0]["InstanceId"]
            wait = dataclasses.replace(BakeWait.agent_online(instance_id), max_attempts=2)
            event = first_event(roundtrip(wait.trigger(waiter_delay=0, **connection)))
            assert event["status"] == status and event["waited"]["waiter"] == "AgentOnline"
        ids = [r["Instances"][0]["InstanceId"] for r in (managed, unmanaged)]
        aws.ec2.terminate_instances(InstanceIds=ids)
    finally:
        aws.iam.delete_instance_profile(InstanceProfileName=profile)
