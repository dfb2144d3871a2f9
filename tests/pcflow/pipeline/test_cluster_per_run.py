"""Clusters per run (issue 27): on the parallelcluster provider a `pretrain` or sweep run makes a cluster of its
own, named from its stack and run key (the same on every retry, so a retry adopts it; two runs of a stack never
share a name), within Slurm accounting's 40 characters; the nightly keeps the stack's cluster, as before."""

from __future__ import annotations

import pytest
from run_factories import make_planned_run

from pcflow.cluster.spec import CLUSTER_NAME_MAX_ACCOUNTING, validate_cluster_name
from pcflow.naming import run_key
from pcflow.pipeline.settings import cluster_name, settings_for_cluster

NETWORK = {
    "head_subnet_id": "subnet-0a1b2c3d4e5f60718",
    "compute_subnet_ids": ["subnet-0a1b2c3d4e5f60718"],
    "head_security_group_id": "sg-0123456789abcdef0",
}
LONGEST_STACK = "s" * 24


@pytest.mark.parametrize("stack", ["research", LONGEST_STACK])
def test_each_run_has_its_own_cluster_name_the_same_on_every_retry(stack):
    when = "manual__2026-12-04T16:20:00.123456+00:00"
    keys = [
        run_key("pretrain", when),
        run_key("pretrain", when.replace("16:20", "16:21")),
        run_key("pretrain_sweep", when),
    ]
    names = [cluster_name(stack, key) for key in keys]
    assert len(set(names)) == 3  # two runs of a DAG, and another DAG's run at the same moment
    assert names == [cluster_name(stack, key) for key in keys]  # deterministic: a retry adopts its cluster
    for name in names:
        assert len(name) <= CLUSTER_NAME_MAX_ACCOUNTING and validate_cluster_name(name, slurm_accounting=True)
        assert name != cluster_name(stack)
    assert cluster_name("research") == "pcflow-research-cluster"  # the stack's (the nightly's), unchanged


def test_the_cluster_settings_name_the_runs_cluster_or_the_stacks(admin_profiles):
    run = make_planned_run(
        admin_profiles.make("aws-gpu", {"network": {"ssh_ingress_cidrs": ["203.0.113.0/24"]}}),
        run_key=run_key("pretrain", "manual__2026-12-04T16:20:00+00:00"),
    )
    own = settings_for_cluster(run, NETWORK, "ami-0123456789abcdef0", own=True)
    kept = settings_for_cluster(run, NETWORK, "ami-0123456789abcdef0")
    assert own["name"] == cluster_name(run.stack, run.run_key) != kept["name"] == cluster_name(run.stack)
