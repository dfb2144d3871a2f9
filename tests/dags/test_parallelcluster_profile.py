"""The pipeline with the `aws-gpu` profile (ParallelCluster), as the rehearsal runs it on the moto server
(`aws-gpu-rehearsal`: aws-gpu plus only what the emulator needs): validate before spend. Bad cluster
settings are refused by the first task; a config ParallelCluster's dry run (the REAL pcluster CLI, own
venv) rejects fails the run right after the network (free), before the image, the dataset or the cluster
cost anything. Moto lacks the APIs of the validators the rehearsal profile suppresses, only those.
No cluster is created here; test_rehearsal.py creates one (the pcluster stand-in's: the local Slurm)."""

from __future__ import annotations

import uuid
from typing import Any

import boto3
import pytest
from dagrun import remove_stack, run_dag, tagged_resources
from rehearsal import PROFILE, own_stack

from pcflow.cluster.config import render_config
from pcflow.cluster.spec import ClusterSpec
from pcflow.merge import deep_merge

pytestmark = pytest.mark.stack
NOT_STARTED = ("upstream_failed", "None", "skipped")


@pytest.fixture
def aws_gpu(airflow, pcluster_cli, admin_profiles):
    """Conf for `pretrain` with an admin's variant of the rehearsal of aws-gpu, in a stack of its own;
    removes the stack after. The settings given are the admin's (written into the profile), not a
    trigger user's."""
    stack = f"pc{uuid.uuid4().hex[:8]}"

    def conf(**settings: Any) -> dict[str, Any]:
        return {"profile": admin_profiles.make(PROFILE, deep_merge(own_stack(stack), settings)), "partition": "dryrun"}

    conf.stack = stack
    yield conf
    # The data bucket is shared by stacks (not tagged with one): this stack is its only user.
    buckets = [b["Name"] for b in boto3.client("s3").list_buckets()["Buckets"]]
    if f"pcflow-{stack}-data" in buckets or tagged_resources("pcflow:stack", stack):
        assert remove_stack(stack) == []


def test_dry_run_rejection_stops_the_run_before_any_spend(aws_gpu):
    result = run_dag("pretrain", aws_gpu(cluster={"config": {"extra_config": {"HeadNode": {"NoSuchSetting": 1}}}}))
    states = result.task_states
    assert result.state == "failed"
    assert states["validate"] == states["network"] == "success"
    assert states["validate_cluster"] == "failed"
    for spend in ("image", "dataset", "cluster", "train"):
        assert states[spend] in NOT_STARTED, (spend, states[spend])
    assert states["teardown"] == states["release_network"] == "success"  # the network (a setup) goes all the same
    # The config the dry run judged: SSH from the profile's CIDR (ParallelCluster's group) and through
    # the network's head group, which carries the same CIDRs.
    head = render_config(ClusterSpec.parse(result.returned["dry_run_settings"])).document["HeadNode"]
    assert head["Ssh"]["AllowedIps"] == "127.0.0.1/32"  # aws-gpu-rehearsal.yaml's
    assert head["Networking"]["AdditionalSecurityGroups"] == [result.returned["network"]["head_security_group_id"]]
    assert tagged_resources("pcflow:run", result.run_key) == []
    stack = result.returned["validate"]["stack"]
    images = boto3.client("ec2").describe_images(Filters=[{"Name": "tag:pcflow:stack", "Values": [stack]}])
    assert images["Images"] == []


@pytest.mark.parametrize(
    ("settings", "complaint"),
    [
        ({"instance_type": "c5.xlarge", "training": {"gpus_per_node": 4, "tasks_per_node": 4}}, "has no GPUs"),
        ({"cluster": {"config": {"name": "c" * 61}}}, "name"),
        ({"cluster": {"config": {"name": "my_cluster!"}}}, "name"),
        ({"cluster": {"config": {"max_count": 1}}, "training": {"nodes": 2}}, "max_count 1 is below"),
        ({"cluster": {"config": {"key_name": "nobody-made-this"}}}, "key_pair: the key pair 'nobody-made-this'"),
        ({"network": {"ssh_ingress_cidrs": []}}, "network: network.ssh_ingress_cidrs is empty"),  # aws-gpu's
    ],
)
def test_bad_cluster_settings_are_refused_by_the_first_task(aws_gpu, settings, complaint, capfd):
    conf = aws_gpu(**settings)
    result = run_dag("pretrain", conf)
    assert result.task_states["validate"] == "failed"
    assert all(state in NOT_STARTED for task, state in result.task_states.items() if task != "validate")
    assert complaint in "".join(capfd.readouterr())  # the task log, as the user reads it
    assert tagged_resources("pcflow:stack", aws_gpu.stack) == []
