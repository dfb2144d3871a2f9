"""EFA and NCCL for multi-node GPUs (issue 27.5): which queues get EFA and a placement group (EC2's
`NetworkInfo.EfaSupported`, answered here by moto in-process), the settings a job on an EFA cluster exports,
and that the run's own training.env still decides them."""

from __future__ import annotations

import subprocess

import boto3
import pytest
from cluster_specs import BASE
from moto import mock_aws

from pcflow.cluster.config import render_config
from pcflow.cluster.fabric import fabric_env
from pcflow.cluster.parallelcluster import ParallelClusterProvider
from pcflow.cluster.spec import ClusterSpec
from pcflow.slurm.render import render_batch_script
from pcflow.slurm.spec import JobSpec, RunDir


@pytest.fixture
def provider(monkeypatch):
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        yield ParallelClusterProvider(hook=None, clients=lambda service: boto3.client(service, region_name="us-east-1"))


def test_every_queue_whose_types_have_efa_gets_it_and_a_placement_group(provider):
    """g5.12xlarge and p4d.24xlarge have EFA, g5.xlarge has not: its fallback queue gets neither."""
    spec = ClusterSpec.parse(
        {
            **BASE,
            "instance_type": "g5.12xlarge",
            "fallback": [
                {"instance_types": ["p4d.24xlarge"], "capacity_type": "ondemand"},
                {"instance_types": ["g5.xlarge"], "capacity_type": "ondemand"},
            ],
        }
    )
    config = render_config(spec, efa=provider.efa_support(spec)).document
    queues = config["Scheduling"]["SlurmQueues"]
    assert [q["Name"] for q in queues] == ["gpu", "gpu-2", "gpu-3"]
    assert [q["ComputeResources"][0].get("Efa") for q in queues] == [{"Enabled": True}, {"Enabled": True}, None]
    assert [q["Networking"].get("PlacementGroup") for q in queues] == [{"Enabled": True}, {"Enabled": True}, None]
    assert all(q["HealthChecks"] == {"Gpu": {"Enabled": True}} for q in queues)
    # A job may run in any queue: the fabric's settings only where every queue has EFA.
    assert provider.job_fabric_env(spec) == {}
    efa_only = ClusterSpec.parse({**BASE, "instance_type": "p4d.24xlarge", "instance_types": ["p5.48xlarge"]})
    assert provider.job_fabric_env(efa_only) == {
        "FI_PROVIDER": "efa",
        "FI_EFA_FORK_SAFE": "1",
        "FI_EFA_USE_DEVICE_RDMA": "1",
    }


def test_the_admin_may_turn_the_placement_group_off_and_efa_must_exist_where_asked(provider):
    spec = ClusterSpec.parse({**BASE, "instance_type": "g5.12xlarge", "placement_group": False})
    queue = render_config(spec, efa=provider.efa_support(spec)).document["Scheduling"]["SlurmQueues"][0]
    assert queue["Networking"]["PlacementGroup"] == {"Enabled": False}
    with pytest.raises(Exception, match="does not support EFA"):
        provider.efa_support(ClusterSpec.parse({**BASE, "instance_type": "g5.xlarge", "efa": True}))


def test_rdma_only_where_every_type_does_it():
    assert fabric_env(False, ["p5.48xlarge"]) == {}
    assert fabric_env(True, ["g5.12xlarge"]) == {"FI_PROVIDER": "efa", "FI_EFA_FORK_SAFE": "1"}
    assert "FI_EFA_USE_DEVICE_RDMA" not in fabric_env(True, ["p4d.24xlarge", "g6.12xlarge"])


def test_the_batch_script_exports_them_unless_training_env_sets_them(tmp_path):
    spec = JobSpec(program=["train.py"], fabric_env=fabric_env(True, ["p5.48xlarge"]))
    script = render_batch_script(spec, RunDir("/shared/r"), job_name="k.train", run_key="k")
    lines = "\n".join(line for line in script.splitlines() if "FI_" in line and not line.startswith("#"))
    probe = f'{lines}\necho "$FI_PROVIDER $FI_EFA_USE_DEVICE_RDMA $FI_EFA_FORK_SAFE"'
    plain = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, env={}, check=True).stdout
    assert plain.split() == ["efa", "1", "1"]
    own = {"FI_EFA_USE_DEVICE_RDMA": "0"}  # the run's training.env, in sbatch's environment
    kept = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, env=own, check=True).stdout
    assert kept.split() == ["efa", "0", "1"]
