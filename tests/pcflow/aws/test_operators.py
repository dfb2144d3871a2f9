"""The operators on the moto server through the `aws_default` connection: XCom shapes, deferral."""

from __future__ import annotations

import pytest

from pcflow.aws.ami import BakeImageOperator
from pcflow.aws.network import DeleteNetworkOperator, EnsureNetworkOperator
from pcflow.aws.teardown import TeardownOperator
from pcflow.aws.waits import ImageAvailableTrigger
from pcflow.paths import include_dir

pytestmark = pytest.mark.stack


class _TI:
    dag_id, run_id, map_index = "pretrain", "manual__2026-11-29T18:00:00+00:00", -1


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


def test_bake_operator_defers_the_image_wait(aws, stack, counts):
    from airflow.sdk.exceptions import TaskDeferred

    ids = EnsureNetworkOperator(task_id="network", stack=stack, waiter_delay=0).execute({"ti": _TI()})
    script = include_dir() / "ami" / "bootstrap.sh"  # bootstrap scripts come from include/ami/ only
    base = aws.amazon_image_id()
    profile = f"pcflow-op-{stack}"
    aws.iam.create_instance_profile(InstanceProfileName=profile)
    try:
        op = BakeImageOperator(
            task_id="ami", stack=stack, pcluster_version="3.16.1", bootstrap_script_path=str(script),
            instance_profile=profile, subnet_id=ids["head_subnet_id"], instance_type="t3.micro",
            base_image_id=base, waiter_delay=0, wait_for_ssm_agent=False,
        )  # fmt: skip
        with pytest.raises(TaskDeferred) as deferred:
            op.execute({"ti": _TI()})
        trigger = deferred.value.trigger
        assert isinstance(trigger, ImageAvailableTrigger)
        path, kwargs = trigger.serialize()
        assert path == "pcflow.aws.waits.ImageAvailableTrigger"
        assert kwargs["botocore_config"]["retries"]["mode"] == "standard"
        # What the triggerer would hand back: the builder is terminated, the image returned.
        event = {"status": "success", "image_id": kwargs["image_id"]}
        result = op.execute_complete({}, event=event, **(deferred.value.kwargs or {}))
        assert result["image_id"] == kwargs["image_id"] and counts()["instance"] == 0
        # Next run: the recipe's image exists, nothing is deferred or launched.
        assert op.execute({"ti": _TI()})["reused"] is True
    finally:
        aws.iam.delete_instance_profile(InstanceProfileName=profile)
