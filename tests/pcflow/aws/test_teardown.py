"""The convergence loop against the moto server: full teardown to zero, out-of-order handlers,
idempotence, dry run, pluggable handlers, and a report when something will not go."""

from __future__ import annotations

import pytest

from pcflow.aws.network import delete_network, ensure_network
from pcflow.aws.network_spec import NetworkSpec
from pcflow.aws.tags import tag_specifications
from pcflow.aws.teardown import (
    Handler,
    Resource,
    Selector,
    TeardownIncomplete,
    build_handlers,
    converge,
    register_handlers,
    teardown,
)
from pcflow.naming import standard_tags

pytestmark = pytest.mark.stack


def full_stack(aws, stack: str, *, run: str | None = None):
    """A network with NAT plus a running instance in it: every kind the EC2 handlers know."""
    ids = ensure_network(
        aws.ec2,
        NetworkSpec(stack=stack, region="us-east-1", nat_gateway=True, ssh_ingress_cidrs=("10.1.0.0/16",)),
        run=run,
        waiter_delay=0,
    )
    image = aws.amazon_image_id()
    aws.ec2.run_instances(
        ImageId=image,
        MinCount=1,
        MaxCount=1,
        InstanceType="t3.micro",
        SubnetId=ids.compute_subnet_ids[0],
        SecurityGroupIds=[ids.cluster_security_group_id],
        TagSpecifications=tag_specifications("instance", standard_tags(stack=stack, component="cluster", run=run)),
    )
    # A detached ENI, as FSx or a crashed launch leaves behind.
    aws.ec2.create_network_interface(
        SubnetId=ids.head_subnet_id,
        Groups=[ids.head_security_group_id],
        TagSpecifications=tag_specifications("network-interface", standard_tags(stack=stack, component="cluster")),
    )
    return ids


def test_teardown_after_full_ensure_leaves_nothing_tagged(aws, stack, counts, arns):
    full_stack(aws, stack)
    before = counts()
    assert before["instance"] == 1 and before["nat-gateway"] == 1 and before["vpc"] == 1
    report = teardown(aws, Selector(stack=stack), pass_delay=0)
    assert report.complete and not report.remaining
    assert {r.kind for r in report.deleted} >= {
        "instance",
        "vpc-endpoint",
        "nat-gateway",
        "elastic-ip",
        "route-table",
        "network-interface",
        "security-group",
        "subnet",
        "internet-gateway",
        "vpc",
    }
    assert set(counts().values()) == {0}
    # The tagging API keeps listing terminated instances and deleted NAT gateways for a while (as AWS
    # does); anything else it lists is a leak, and those two must be in their final state.
    left = arns()
    assert [a for a in left if ":instance/" not in a and ":natgateway/" not in a] == []
    for arn in left:
        kind, resource_id = arn.rsplit(":", 1)[1].split("/")
        if kind == "instance":
            found = aws.ec2.describe_instances(InstanceIds=[resource_id])["Reservations"][0]["Instances"][0]
            assert found["State"]["Name"] == "terminated"
        else:
            assert aws.ec2.describe_nat_gateways(NatGatewayIds=[resource_id])["NatGateways"][0]["State"] == "deleted"


def test_teardown_twice_is_a_no_op(aws, stack, counts):
    full_stack(aws, stack)
    teardown(aws, Selector(stack=stack), pass_delay=0)
    again = teardown(aws, Selector(stack=stack), pass_delay=0)
    assert again.deleted == [] and again.remaining == [] and again.passes == 0
    assert set(counts().values()) == {0}


def test_out_of_order_handlers_still_converge(aws, stack, counts):
    """VPC first, instances last: every early delete hits DependencyViolation and is retried next pass."""
    full_stack(aws, stack)
    handlers = build_handlers(aws, ["ec2"])
    for handler in handlers:  # reverse the known order
        handler.order = -handler.order
    report = converge(handlers, Selector(stack=stack), pass_delay=0)
    assert report.complete and report.passes > 1
    assert set(counts().values()) == {0}


def test_dry_run_reports_in_order_and_deletes_nothing(aws, stack, counts):
    full_stack(aws, stack)
    before = counts()
    report = teardown(aws, Selector(stack=stack), dry_run=True)
    assert counts() == before
    kinds = [r.kind for r in report.would_delete]
    assert kinds.index("instance") < kinds.index("subnet") < kinds.index("internet-gateway") < kinds.index("vpc")
    assert report.to_xcom()["would_delete"] and "would delete" in report.summary()


def test_run_scoped_teardown_leaves_other_runs_and_stacks(aws, stack, counts):
    full_stack(aws, stack, run="run-a")
    other = f"{stack}-b"
    ensure_network(aws.ec2, NetworkSpec(stack=other, region="us-east-1"), run="run-b", waiter_delay=0)
    try:
        teardown(aws, Selector(stack=stack, run="run-a"), pass_delay=0)
        assert set(counts().values()) == {0}
        assert aws.ec2.describe_vpcs(Filters=[{"Name": "tag:pcflow:stack", "Values": [other]}])["Vpcs"]
    finally:
        teardown(aws, Selector(stack=other), pass_delay=0)


def test_delete_network_only_touches_the_network_component(aws, stack, counts):
    ensure_network(aws.ec2, NetworkSpec(stack=stack, region="us-east-1"), waiter_delay=0)
    delete_network(aws, stack=stack, pass_delay=0)
    assert set(counts().values()) == {0}


class Stubborn(Handler):
    """A plugged-in kind (as the cluster owner would add) whose delete never succeeds."""

    kind, order = "test-stubborn", 5

    def __init__(self):
        self.attempts = 0

    def list(self, selector):
        return [Resource(self.kind, "thing-1", {"pcflow:stack": selector.stack})]

    def delete(self, resource):
        from botocore.exceptions import ClientError

        self.attempts += 1
        raise ClientError({"Error": {"Code": "DependencyViolation", "Message": "still used"}}, "DeleteThing")


def test_no_progress_stops_with_a_report_and_fails(aws, stack):
    ensure_network(aws.ec2, NetworkSpec(stack=stack, region="us-east-1"), waiter_delay=0)
    stubborn = Stubborn()
    with pytest.raises(TeardownIncomplete, match="DependencyViolation: still used") as caught:
        teardown(aws, Selector(stack=stack), extra_handlers=[stubborn], pass_delay=0, patience=2)
    report = caught.value.report
    assert [r.id for r in report.remaining] == ["thing-1"]
    assert {r.kind for r in report.deleted} >= {"vpc", "subnet"}
    assert stubborn.attempts == report.passes == 4  # one pass that progressed, then patience + 1 stale passes


def test_registered_handler_sets_plug_into_the_loop(aws, stack):
    deleted = []

    class Recorder(Handler):
        kind, order = "test-recorder", 1

        def list(self, selector):
            return [] if deleted else [Resource(self.kind, "r-1", {"pcflow:stack": selector.stack})]

        def delete(self, resource):
            deleted.append(resource.id)

    register_handlers("test-recorder", lambda clients: [Recorder()], replace=True)
    report = teardown(aws, Selector(stack=stack), handler_sets=["test-recorder"], pass_delay=0)
    assert deleted == ["r-1"] and [r.id for r in report.deleted] == ["r-1"]
    with pytest.raises(ValueError, match="unknown teardown handler set"):
        teardown(aws, Selector(stack=stack), handler_sets=["no-such-set"])
