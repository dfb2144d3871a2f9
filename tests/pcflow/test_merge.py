"""Which lists merge (issue 27.3): the cluster's set-like lists add to the profile's, ParallelCluster's named
lists under `extra_config` merge by Name, and every other list (a capacity fallback order) replaces."""

from __future__ import annotations

from pcflow.cluster.config import render_config
from pcflow.cluster.spec import ClusterSpec
from pcflow.merge import deep_merge
from pcflow.runspec import load_profile, resolve_run_spec

#: The smallest cluster spec (tests/pcflow/cluster/cluster_specs.py's BASE).
BASE = {
    "name": "pcflow-unit",
    "region": "us-east-1",
    "key_name": "k",
    "head_subnet_id": "subnet-0123abcd",
    "ssh_allowed_ips": "203.0.113.0/24",
}


def test_an_overlay_adds_to_the_cluster_lists_of_the_profile_it_extends(admin_profiles):
    base = admin_profiles.make("aws-gpu", {"cluster": {"suppress_validators": ["KeyPairValidator"]}})
    overlay = admin_profiles.make(
        "aws-gpu-rehearsal", {"extends": base, "cluster": {"suppress_validators": ["KeyPairValidator", "UrlValidator"]}}
    )
    # write_profile lays the changes over the shipped overlay: its three validators, then the new one
    shipped = load_profile("aws-gpu-rehearsal")["cluster"]["suppress_validators"]
    merged = resolve_run_spec(overlay, {}).cluster.suppress_validators
    assert merged == ["KeyPairValidator", *(v for v in shipped if v != "KeyPairValidator"), "UrlValidator"]


def test_an_ordered_list_replaces():
    fallback = [{"instance_types": ["g5.12xlarge"], "capacity_type": "ondemand"}]
    base = {"capacity": {"fallback": [{"instance_types": ["g6.12xlarge"], "capacity_type": "spot"}]}}
    assert deep_merge(base, {"capacity": {"fallback": fallback}})["capacity"]["fallback"] == fallback
    assert deep_merge({"cluster": {"x": [1, 2]}}, {"cluster": {"x": [3]}}) == {"cluster": {"x": [3]}}


def test_extra_config_merges_queues_by_name_and_keeps_those_pcflow_renders():
    extra = {"Scheduling": {"SlurmQueues": [{"Name": "gpu", "JobExclusiveAllocation": True}, {"Name": "cpu"}]}}
    spec = ClusterSpec.parse({**BASE, "extra_config": extra})
    first, added = render_config(spec).document["Scheduling"]["SlurmQueues"]
    assert first["Name"] == "gpu" and first["JobExclusiveAllocation"] is True
    assert first["ComputeResources"][0]["InstanceType"] == "g5.xlarge"  # what pcflow rendered stays
    assert added == {"Name": "cpu"}
