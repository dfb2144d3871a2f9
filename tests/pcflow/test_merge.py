"""Which lists merge (issue 27.3): the cluster's set-like lists add to the profile's, ParallelCluster's named
lists under `extra_config` merge by Name (tests/pcflow/cluster/test_cluster_units.py, beside the specs it
renders), and every other list (a capacity fallback order) replaces."""

from __future__ import annotations

from pcflow.merge import deep_merge
from pcflow.runspec import load_profile, resolve_run_spec


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
