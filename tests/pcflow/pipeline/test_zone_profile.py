"""A profile whose capacity falls back to another availability zone (issue 27.3), at unit level: the first task
keeps the zone in the run's capacity order, the cluster stage renders that option's queue in the network's
subnet of the zone; the subnets stay the admin's (the profile's network section): no run's conf, no
`extra_config` and no zone the network makes no subnet in may point a queue elsewhere; and a zone beside a
file system ParallelCluster creates is refused before the network exists, as ParallelCluster's dry run refuses
it (tests/pcflow/cluster/test_zone_fallback.py runs the real dry run and the stand-in's shortage per zone)."""

from __future__ import annotations

import pytest
import yaml

from pcflow.cluster.config import render_config
from pcflow.cluster.spec import ClusterSpec, ClusterSpecError
from pcflow.pipeline.resolved import load
from pcflow.pipeline.settings import settings_for_cluster
from pcflow.pipeline.validation import planned_cluster

pytestmark = pytest.mark.security
ZONE, SUBNET = "us-east-1b", "subnet-0b1b2c3d4e5f60718"
NETWORK = {
    "head_subnet_id": "subnet-0a1b2c3d4e5f60718",
    "compute_subnet_ids": ["subnet-0c1b2c3d4e5f60718"],
    "zone_subnet_ids": {ZONE: SUBNET},
    "head_security_group_id": "sg-0123456789abcdef0",
}
#: aws-gpu (its rehearsal: a dataset the first task reads offline) with a third option, on-demand in another
#: zone, and no file system ParallelCluster creates.
ZONE_VARIANT = {
    "network": {"zone_subnet_cidrs": {ZONE: "10.60.32.0/20"}},
    "capacity": {
        "fallback": [
            {"instance_types": ["g5.12xlarge", "g6.12xlarge"], "capacity_type": "ondemand"},
            {"instance_types": ["g5.12xlarge", "g6.12xlarge"], "capacity_type": "ondemand", "availability_zone": ZONE},
        ]
    },
    "cluster": {"config": {"fsx": None}},
}


@pytest.fixture
def first_task(offline, monkeypatch):
    """The first task offline, its ParallelCluster check too but for EC2's answer about the instance types."""
    from pcflow.cluster import spec

    monkeypatch.setattr(spec, "check_instance_type", lambda *args, **kwargs: {})
    return offline


def rendered_queues(document: dict, network: dict = NETWORK) -> dict[str, list[str]]:
    """The queues' subnets of the config the cluster stage renders from the first task's document."""
    spec = ClusterSpec.parse(settings_for_cluster(load(document), network, "ami-0123456789abcdef0"))
    queues = yaml.safe_load(render_config(spec).text)["Scheduling"]["SlurmQueues"]
    return {q["Name"]: q["Networking"]["SubnetIds"] for q in queues}


def test_the_zone_fallback_reaches_the_capacity_order_and_its_queue_launches_in_that_zones_subnet(
    first_task, admin_profiles
):
    run = first_task({"profile": admin_profiles.make("aws-gpu-rehearsal", ZONE_VARIANT), "partition": "p1"})
    assert [(o["partition"], o["availability_zone"]) for o in run["capacity_order"]] == [
        ("gpu", None),
        ("gpu-2", None),
        ("gpu-3", ZONE),
    ]
    planned_cluster(load(run))  # the first task's check of the cluster it will make
    assert rendered_queues(run) == {
        "gpu": NETWORK["compute_subnet_ids"],
        "gpu-2": NETWORK["compute_subnet_ids"],
        "gpu-3": [SUBNET],
    }


def test_a_zone_beside_managed_fsx_is_refused_by_the_first_task(first_task, admin_profiles):
    variant = {**ZONE_VARIANT, "cluster": {}}  # aws-gpu's FSx for Lustre stays
    with pytest.raises(ClusterSpecError, match=r"ManagedFsxMultiAzValidator.*only the deployment admin"):
        first_task({"profile": admin_profiles.make("aws-gpu-rehearsal", variant), "partition": "p1"})


def test_a_zone_the_profiles_network_lists_no_subnet_for_is_refused(first_task, admin_profiles):
    variant = {**ZONE_VARIANT, "network": {}}
    with pytest.raises(Exception, match=r"us-east-1b.*network\.zone_subnet_cidrs"):
        first_task({"profile": admin_profiles.make("aws-gpu-rehearsal", variant), "partition": "p1"})


@pytest.mark.parametrize(
    "conf",
    [
        {"network": {"zone_subnet_cidrs": {"us-east-1c": "10.60.48.0/20"}}},
        {
            "capacity": {
                "fallback": [
                    {"instance_types": ["g5.12xlarge"], "capacity_type": "ondemand", "availability_zone": ZONE}
                ]
            }
        },
    ],
)
def test_a_trigger_user_names_no_zone_or_subnet(first_task, admin_profiles, conf):
    profile = admin_profiles.make("aws-gpu-rehearsal", ZONE_VARIANT)
    with pytest.raises(Exception, match=r"only the deployment admin|may change only"):
        first_task({"profile": profile, "partition": "p1", "overrides": conf})


@pytest.mark.parametrize("path", ["network.zone_subnet_cidrs", "network.vpc_id", "network.private_subnet_ids"])
def test_no_profile_may_make_the_subnets_overridable(first_task, admin_profiles, path):
    profile = admin_profiles.make("aws-gpu-rehearsal", {"overridable": {path: {}}})
    with pytest.raises(Exception, match=f"overridable: '{path}' covers {path}, which only the deployment admin"):
        first_task({"profile": profile, "partition": "p1"})


def test_extra_config_cannot_point_a_queue_at_another_subnet(first_task, admin_profiles):
    run = first_task({"profile": admin_profiles.make("aws-gpu-rehearsal", ZONE_VARIANT), "partition": "p1"})
    queue = {"Name": "gpu-3", "Networking": {"SubnetIds": ["subnet-0ffffffffffffffff"]}}
    run["cluster"]["config"]["extra_config"] = {"Scheduling": {"SlurmQueues": [queue]}}
    with pytest.raises(ClusterSpecError, match=r"SlurmQueues\[2\]\.Networking\.SubnetIds .* replaces the network's"):
        rendered_queues(run)
