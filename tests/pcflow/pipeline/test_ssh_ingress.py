"""Who may SSH to a ParallelCluster head node (issue 23): the admin's `network.ssh_ingress_cidrs` reach
the config the cluster stage renders, as ParallelCluster's `HeadNode.Ssh.AllowedIps` (its own group:
one CIDR) and pcflow's head security group attached beside it (every CIDR); ParallelCluster's default,
port 22 from 0.0.0.0/0, is never left in place. An empty list is refused by the first task, the whole
internet passes only with the admin's explicit flag, and neither a run's conf nor `extra_config` changes
it. Unit level: the pipeline's own functions on the `aws-gpu` profile (the real `pcluster --dryrun`
judges such a config in tests/pcflow/cluster/test_dryrun.py)."""

from __future__ import annotations

import pytest
import yaml
from run_factories import make_planned_run

from pcflow.checks import check_network
from pcflow.cluster.config import render_config
from pcflow.cluster.spec import ClusterSpec, ClusterSpecError
from pcflow.pipeline.settings import settings_for_cluster

pytestmark = pytest.mark.security

#: What the network task returns (its head group carries SSH from every configured CIDR).
NETWORK = {
    "head_subnet_id": "subnet-0a1b2c3d4e5f60718",
    "compute_subnet_ids": ["subnet-0a1b2c3d4e5f60718"],
    "head_security_group_id": "sg-0123456789abcdef0",
}
WORKERS = "203.0.113.0/24"  # the Airflow workers' egress (a documentation range)


def admins_run(admin_profiles, config: dict | None = None, **network):
    """The run of an admin's aws-gpu with these network settings (and `cluster.config` settings laid over the
    profile's), as the first task plans it."""
    overrides = {"cluster": {"config": config}} if config else {}
    return make_planned_run(admin_profiles.make("aws-gpu", {"network": network}), **overrides)


def head_node(run) -> dict:
    """The rendered config's HeadNode, as the cluster stage makes it from the run and the network."""
    check_network(run)  # the first task's check of the same settings
    spec = ClusterSpec.parse(settings_for_cluster(run, NETWORK, "ami-0123456789abcdef0"))
    return yaml.safe_load(render_config(spec).text)["HeadNode"]


def refusal(validate, conf: dict) -> str:
    from airflow.sdk.exceptions import AirflowFailException

    with pytest.raises(AirflowFailException) as refused:
        validate(conf)
    return str(refused.value)


@pytest.mark.parametrize(
    ("cidrs", "allowed_ips"),
    [
        ([WORKERS], WORKERS),
        ([WORKERS, "198.51.100.7/32"], WORKERS),  # the second through pcflow's head group
        (["2001:db8::/48", "198.51.100.7/32"], "198.51.100.7/32"),  # AllowedIps takes IPv4 only
    ],
)
def test_the_profiles_cidrs_reach_the_rendered_config(admin_profiles, cidrs, allowed_ips):
    head = head_node(admins_run(admin_profiles, ssh_ingress_cidrs=cidrs))
    assert head["Ssh"]["AllowedIps"] == allowed_ips
    assert head["Networking"]["AdditionalSecurityGroups"] == [NETWORK["head_security_group_id"]]
    assert "SecurityGroups" not in head["Networking"]  # ParallelCluster's own group stays, narrowed


def test_aws_gpu_as_shipped_is_refused_until_the_admin_sets_the_cidrs(offline):
    message = refusal(offline, {"profile": "aws-gpu", "partition": "p1"})
    assert "network: network.ssh_ingress_cidrs is empty" in message
    assert "the deployment admin sets it in the profile" in message and "docs/deploy.md" in message


def test_cidrs_parallelcluster_cannot_take_are_refused_by_the_first_task(offline, admin_profiles):
    name = admin_profiles.make("aws-gpu", {"network": {"ssh_ingress_cidrs": ["2001:db8::/48"]}})
    assert "has no IPv4 range" in refusal(offline, {"profile": name, "partition": "p1"})


def test_the_internet_passes_only_with_the_admins_explicit_flag(offline, admin_profiles):
    anywhere = admin_profiles.make("aws-gpu", {"network": {"ssh_ingress_cidrs": ["0.0.0.0/0"]}})
    message = refusal(offline, {"profile": anywhere, "partition": "p1"})
    assert "network.ssh_ingress_cidrs: Value error, the list contains 0.0.0.0/0 (SSH open to the internet)" in message
    run = admins_run(admin_profiles, ssh_ingress_cidrs=["0.0.0.0/0"], allow_ssh_from_anywhere=True)
    assert head_node(run)["Ssh"]["AllowedIps"] == "0.0.0.0/0"


@pytest.mark.parametrize(
    "network",
    [{"ssh_ingress_cidrs": ["0.0.0.0/0"]}, {"allow_ssh_from_anywhere": True}, {"ssh_ingress_cidrs": [WORKERS]}],
)
def test_a_trigger_user_cannot_choose_who_may_ssh(offline, network):
    message = refusal(offline, {"partition": "p1", "overrides": {"network": network}})
    assert f"network.{next(iter(network))}: only the deployment admin may change this" in message


@pytest.mark.parametrize("path", ["network", "network.allow_ssh_from_anywhere", "network.ssh_ingress_cidrs"])
def test_no_profile_may_make_them_overridable(offline, admin_profiles, path):
    name = admin_profiles.make("local", {"overridable": {path: {}}})
    message = refusal(offline, {"profile": name, "partition": "p1"})
    assert f"overridable: {path!r} covers network." in message and "only the deployment admin sets" in message


@pytest.mark.parametrize(
    ("head_node_config", "complaint"),
    [
        ({"Ssh": {"AllowedIps": "0.0.0.0/0"}}, "HeadNode.Ssh.AllowedIps '0.0.0.0/0' replaces the profile's"),
        ({"Networking": {"SecurityGroups": ["sg-0fedcba9876543210"]}}, "replaces ParallelCluster's own head"),
        ({"Networking": {"AdditionalSecurityGroups": ["sg-0fedcba9876543210"]}}, "replaces the network's head"),
    ],
)
def test_extra_config_cannot_undo_it(admin_profiles, head_node_config, complaint):
    extra_config = {"HeadNode": head_node_config}
    run = admins_run(admin_profiles, {"extra_config": extra_config}, ssh_ingress_cidrs=[WORKERS])
    with pytest.raises(ClusterSpecError, match="only the deployment admin sets it") as refused:
        head_node(run)
    assert complaint in str(refused.value)


def test_extra_config_may_add_a_head_group_beside_pcflows(admin_profiles):
    groups = [NETWORK["head_security_group_id"], "sg-0fedcba9876543210"]
    extra_config = {"HeadNode": {"Networking": {"AdditionalSecurityGroups": groups}}}
    run = admins_run(admin_profiles, {"extra_config": extra_config}, ssh_ingress_cidrs=[WORKERS])
    assert head_node(run)["Networking"]["AdditionalSecurityGroups"] == groups


@pytest.mark.parametrize("setting", [{"ssh_allowed_ips": "0.0.0.0/0"}, {"allow_ssh_from_anywhere": True}])
def test_the_cluster_config_does_not_bypass_the_network_section(admin_profiles, setting):
    run = admins_run(admin_profiles, setting, ssh_ingress_cidrs=[WORKERS])
    with pytest.raises(ClusterSpecError, match="set from the network section"):
        head_node(run)
