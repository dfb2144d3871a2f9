"""Ownership: a run adopts, updates or deletes only what its stack (and, for a run's own resources, its
run) owns. Each test is a hostile situation on the moto server that must have no effect on another
stack's resources, counted by tag; the clusters come from the ParallelCluster STAND-IN CLI (its stack
and head node are real moto resources; see test_standin_lifecycle.py)."""

from __future__ import annotations

import datetime as dt
import re
import uuid

import pytest
from taskcontext import make_context

from pcflow.aws.clients import aws_client
from pcflow.aws.janitor import run_janitor
from pcflow.aws.tags import tag_specifications
from pcflow.aws.teardown import Selector, teardown
from pcflow.cluster.config import render_config
from pcflow.cluster.operators import DeleteClusterOperator
from pcflow.cluster.parallelcluster import ClusterNotOwned
from pcflow.cluster.providers import delete_cluster, ensure_cluster, make_provider, validate_cluster
from pcflow.cluster.spec import ClusterSpec, ClusterSpecError
from pcflow.naming import run_key, standard_tags

pytestmark = [pytest.mark.security, pytest.mark.stack]
WAIT = {"waiter_delay": 1, "waiter_max_attempts": 10}
#: A cluster spec checked without AWS (the spec's own validation and the renderer).
OFFLINE_SPEC = {
    "name": "pcflow-research-cluster",
    "region": "us-east-1",
    "key_name": "pcflow",
    "head_subnet_id": "subnet-0123456789abcdef0",
    "ssh_allowed_ips": "203.0.113.0/24",
}


def owned_by(stack: str) -> list[str]:
    """Everything carrying `pcflow:stack=<stack>`: cluster stacks (CloudFormation) and live instances."""
    cfn, ec2 = aws_client("cloudformation"), aws_client("ec2")
    stacks = [
        f"{s['StackName']}:{s['StackStatus']}:{sorted((t['Key'], t['Value']) for t in s.get('Tags', []))}"
        for s in cfn.describe_stacks()["Stacks"]
        if {"Key": "pcflow:stack", "Value": stack} in s.get("Tags", [])
    ]
    filters = [{"Name": "tag:pcflow:stack", "Values": [stack]}, {"Name": "instance-state-name", "Values": ["running"]}]
    instances = [
        i["InstanceId"] for r in ec2.describe_instances(Filters=filters)["Reservations"] for i in r["Instances"]
    ]
    return sorted(stacks + instances)


@pytest.fixture
def provider(standin_cli):
    return make_provider("parallelcluster", pcluster_path=str(standin_cli))


def test_another_stacks_cluster_is_never_adopted_updated_or_deleted(provider, site, standin_cli):
    """Same cluster name, other stack: the validate task, the ensure (with and without allow_updates)
    and the delete task all refuse it, and the other stack's cluster is exactly as it was."""
    from airflow.sdk.exceptions import AirflowFailException

    other = f"o{site.unique}"
    spec = site.spec()
    ensure_cluster(provider, spec, stack=other, **WAIT)
    before = owned_by(other)
    try:
        assert len(before) == 3  # its cluster stack, head node and compute node (one local Slurm node)
        with pytest.raises(ClusterNotOwned, match=f"belongs to stack {other} .*not to stack {site.stack}"):
            validate_cluster(provider, spec, stack=site.stack)
        with pytest.raises(ClusterNotOwned):
            ensure_cluster(provider, spec, stack=site.stack, **WAIT)
        with pytest.raises(ClusterNotOwned):  # an update in place is no way around it
            ensure_cluster(provider, {**spec, "max_count": 4, "allow_updates": True}, stack=site.stack, **WAIT)
        with pytest.raises(ClusterNotOwned):  # nor a run of the owning stack adopting its shared cluster
            ensure_cluster(provider, spec, stack=other, run="some-run", **WAIT)
        delete = DeleteClusterOperator(
            task_id="delete_cluster",
            provider="parallelcluster",
            cluster_name=spec["name"],
            stack=site.stack,
            pcluster_path=str(standin_cli),
            export_fsx=True,
            deferrable=False,
            **WAIT,
        )
        with pytest.raises(AirflowFailException, match=f"belongs to stack {other}"):
            delete.execute(make_context("delete_cluster"))
        deferrable = DeleteClusterOperator(
            task_id="delete_cluster",
            provider="parallelcluster",
            cluster_name=spec["name"],
            stack=site.stack,
            pcluster_path=str(standin_cli),
            **WAIT,
        )
        with pytest.raises(AirflowFailException, match=f"belongs to stack {other}"):
            deferrable.execute(make_context("delete_cluster"))
        assert owned_by(other) == before
    finally:
        delete_cluster(provider, spec["name"], owner=(other, None), **WAIT)
    assert owned_by(other) == []


def test_a_runs_own_cluster_is_deleted_by_that_run_only(provider, site, standin_cli):
    """Run-scoped: another run of the same stack can neither adopt nor delete it; its own run can."""
    from airflow.sdk.exceptions import AirflowFailException

    spec = site.spec()
    mine, theirs = make_context("delete_cluster"), make_context("delete_cluster")
    owner_run = run_key(mine["ti"].dag_id, mine["run_id"])
    ensure_cluster(provider, spec, stack=site.stack, run=owner_run, **WAIT)
    before = owned_by(site.stack)

    def delete_in(context):
        return DeleteClusterOperator(
            task_id="delete_cluster",
            provider="parallelcluster",
            cluster_name=spec["name"],
            stack=site.stack,
            run_scoped=True,
            pcluster_path=str(standin_cli),
            deferrable=False,
            **WAIT,
        ).execute(context)

    try:
        with pytest.raises(ClusterNotOwned, match=f"run {owner_run}"):
            ensure_cluster(provider, spec, stack=site.stack, run="another-run", **WAIT)
        with pytest.raises(ClusterNotOwned):  # the stack's shared (nightly) cluster would be another one
            ensure_cluster(provider, spec, stack=site.stack, **WAIT)
        with pytest.raises(AirflowFailException, match=f"belongs to stack {site.stack}, run {owner_run}"):
            delete_in(theirs)
        assert owned_by(site.stack) == before
        assert delete_in(mine)["deleted"] is True
    finally:
        delete_cluster(provider, spec["name"], owner=(site.stack, owner_run), **WAIT)
    assert owned_by(site.stack) == []


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"tags": {"pcflow:expires": "never"}}, "tags"),
        ({"tags": {"PCFLOW:stack": "other"}}, "tags"),
        ({"tags": {"parallelcluster:version": "1"}}, "tags"),
        ({"extra_config": {"Tags": [{"Key": "pcflow:run", "Value": "x"}]}}, "extra_config.Tags"),
        (
            {"extra_config": {"Scheduling": {"SlurmQueues": [{"Name": "gpu", "Tags": [{"Key": "pcflow:stack"}]}]}}},
            "extra_config.Scheduling.SlurmQueues[0].Tags",
        ),
    ],
)
def test_config_tags_cannot_replace_pcflow_tags(settings, field):
    with pytest.raises(ClusterSpecError, match=re.escape(f"{field}: tag key")):
        ClusterSpec.parse({**OFFLINE_SPEC, **settings})


def test_pcflow_tags_win_in_the_rendered_config():
    spec = ClusterSpec.parse({**OFFLINE_SPEC, "tags": {"team": "vision"}})
    tags = standard_tags(stack="research", component="cluster", run="r1", ttl=dt.timedelta(hours=1))
    rendered = {t["Key"]: t["Value"] for t in render_config(spec, tags=tags).document["Tags"]}
    assert {k: rendered[k] for k in tags} == tags and rendered["team"] == "vision"


def test_janitor_leaves_a_kept_clusters_interfaces(local_stack):
    """A kept cluster's interface (pcflow:expires=never) is not reaped with an expired run's, which is."""
    ec2 = aws_client("ec2")
    stack = f"j{uuid.uuid4().hex[:10]}"
    kept = standard_tags(stack=stack, component="cluster")
    expired = standard_tags(stack=stack, component="cluster", run="gone", ttl=dt.timedelta(hours=-1))
    vpc = ec2.create_vpc(CidrBlock="10.78.0.0/16", TagSpecifications=tag_specifications("vpc", kept))["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(
        VpcId=vpc, CidrBlock="10.78.0.0/20", TagSpecifications=tag_specifications("subnet", kept)
    )
    subnet_id = subnet["Subnet"]["SubnetId"]

    def interface(tags):
        made = ec2.create_network_interface(
            SubnetId=subnet_id, TagSpecifications=tag_specifications("network-interface", tags)
        )
        return made["NetworkInterface"]["NetworkInterfaceId"]

    keep_id, reap_id = interface(kept), interface(expired)
    try:
        report = run_janitor(aws_client, stack=stack, dry_run=False, pass_delay=0)
        assert [(r.kind, r.id) for r in report.deleted] == [("network-interface", reap_id)]
        left = ec2.describe_network_interfaces(Filters=[{"Name": "tag:pcflow:stack", "Values": [stack]}])
        assert [n["NetworkInterfaceId"] for n in left["NetworkInterfaces"]] == [keep_id]
    finally:
        teardown(aws_client, Selector(stack=stack), handler_sets=("ec2",), pass_delay=0)
