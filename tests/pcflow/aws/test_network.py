"""The network stage against the moto server: idempotent ensure, crash-and-retry, bad input, adoption."""

from __future__ import annotations

import pytest

from pcflow.aws.network import NetworkMismatch, ensure_network
from pcflow.aws.network_spec import NetworkSpec

pytestmark = pytest.mark.stack

SSH = ("203.0.113.0/24",)


def spec(stack: str, **overrides) -> NetworkSpec:
    return NetworkSpec(**{"stack": stack, "region": "us-east-1", "ssh_ingress_cidrs": SSH, **overrides})


def test_ensure_twice_creates_nothing_the_second_time(aws, stack, counts):
    first = ensure_network(aws.ec2, spec(stack), waiter_delay=0)
    after_first = counts()
    assert after_first["vpc"] == 1
    assert after_first["subnet"] == 1  # no NAT: compute shares the public subnet
    assert after_first["internet-gateway"] == 1
    assert after_first["route-table"] == 1
    assert after_first["vpc-endpoint"] == 1
    assert after_first["security-group"] == 2
    second = ensure_network(aws.ec2, spec(stack), waiter_delay=0)
    assert counts() == after_first
    assert second == first
    assert first.compute_subnet_ids == (first.head_subnet_id,)


def test_security_groups_allow_ssh_only_from_configured_cidrs(aws, stack):
    ids = ensure_network(aws.ec2, spec(stack), waiter_delay=0)
    head, cluster = aws.ec2.describe_security_groups(
        GroupIds=[ids.head_security_group_id, ids.cluster_security_group_id]
    )["SecurityGroups"]
    if head["GroupId"] != ids.head_security_group_id:
        head, cluster = cluster, head
    ssh_cidrs = {r["CidrIp"] for p in head["IpPermissions"] if p.get("FromPort") == 22 for r in p["IpRanges"]}
    assert ssh_cidrs == set(SSH)
    all_cidrs = {r["CidrIp"] for p in head["IpPermissions"] + cluster["IpPermissions"] for r in p.get("IpRanges", [])}
    assert "0.0.0.0/0" not in all_cidrs
    self_rule = [p for p in cluster["IpPermissions"] if p["IpProtocol"] == "-1"]
    assert [g["GroupId"] for g in self_rule[0]["UserIdGroupPairs"]] == [ids.cluster_security_group_id]
    # Changing the CIDR list converges the rule set: the old CIDR is revoked, the new one added.
    ensure_network(aws.ec2, spec(stack, ssh_ingress_cidrs=("198.51.100.7/32",)), waiter_delay=0)
    head = aws.ec2.describe_security_groups(GroupIds=[ids.head_security_group_id])["SecurityGroups"][0]
    ssh_cidrs = {r["CidrIp"] for p in head["IpPermissions"] if p.get("FromPort") == 22 for r in p["IpRanges"]}
    assert ssh_cidrs == {"198.51.100.7/32"}


def test_nat_layout_puts_compute_in_private_subnets(aws, stack, counts):
    ids = ensure_network(aws.ec2, spec(stack, nat_gateway=True), waiter_delay=0)
    assert ids.nat_gateway_id and ids.private_subnet_ids and ids.compute_subnet_ids == ids.private_subnet_ids
    before = counts()
    assert before["nat-gateway"] == 1 and before["elastic-ip"] == 1 and before["route-table"] == 2
    routes = aws.ec2.describe_route_tables(RouteTableIds=[ids.route_table_ids[1]])["RouteTables"][0]["Routes"]
    assert any(r.get("NatGatewayId") == ids.nat_gateway_id for r in routes)
    endpoint = aws.ec2.describe_vpc_endpoints(VpcEndpointIds=[ids.s3_endpoint_id])["VpcEndpoints"][0]
    assert set(endpoint["RouteTableIds"]) == set(ids.route_table_ids)
    ensure_network(aws.ec2, spec(stack, nat_gateway=True), waiter_delay=0)
    assert counts() == before


@pytest.mark.parametrize("operation", ["CreateVpc", "CreateSubnet", "CreateRouteTable", "CreateSecurityGroup"])
def test_crash_after_create_then_retry_makes_no_duplicate(aws, stack, counts, operation):
    """The create call reaches AWS, then the process dies before recording the id (simulated by
    raising in botocore's after-call hook); the retry finds the resource by its tags."""

    class Crash(Exception):
        pass

    def crash(**_):
        raise Crash(f"killed after {operation}")

    event = f"after-call.ec2.{operation}"
    aws.ec2.meta.events.register(event, crash)
    try:
        with pytest.raises(Crash):
            ensure_network(aws.ec2, spec(stack), waiter_delay=0)
    finally:
        aws.ec2.meta.events.unregister(event, crash)
    ensure_network(aws.ec2, spec(stack), waiter_delay=0)
    after = counts()
    assert (after["vpc"], after["subnet"], after["route-table"], after["security-group"]) == (1, 1, 1, 2)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"vpc_cidr": "10.0.0.0/33"}, "invalid CIDR"),
        ({"vpc_cidr": "10.0.0.1/16"}, "invalid CIDR"),
        ({"public_subnet_cidr": "192.168.0.0/24"}, "not inside vpc_cidr"),
        (
            {"nat_gateway": True, "private_subnet_cidrs": ("10.42.0.0/18",)},
            "CIDR overlap",
        ),
        ({"ssh_ingress_cidrs": ("0.0.0.0/0",)}, "allow_ssh_from_anywhere"),
        ({"region": "us-nowhere-9"}, "unknown AWS region"),
        ({"ssh_ingress_cidrs": "10.0.0.0/8"}, "must be a list"),
        ({"public_subnet_id": "subnet-123"}, "only be given together with vpc_id"),
    ],
)
def test_bad_input_is_refused_before_anything_is_created(aws, stack, counts, overrides, message):
    before = counts()
    values = {"stack": stack, "region": "us-east-1", "ssh_ingress_cidrs": SSH, **overrides}
    with pytest.raises(ValueError, match=message):
        ensure_network(aws.ec2, NetworkSpec(**values), waiter_delay=0)
    assert counts() == before


def test_unknown_spec_keys_and_availability_zone_are_refused(aws, stack, counts):
    with pytest.raises(ValueError, match="unknown network setting"):
        NetworkSpec.of(stack, "us-east-1", {"vpc_cidrr": "10.0.0.0/16"})
    with pytest.raises(ValueError, match="not available in us-east-1"):
        ensure_network(aws.ec2, spec(stack, availability_zone="us-east-1zz"), waiter_delay=0)
    assert set(counts().values()) == {0}


def test_existing_vpc_with_other_cidr_is_refused_not_changed(aws, stack, counts):
    ensure_network(aws.ec2, spec(stack), waiter_delay=0)
    before = counts()
    with pytest.raises(NetworkMismatch, match="tear the stack's network down first"):
        ensure_network(aws.ec2, spec(stack, vpc_cidr="10.43.0.0/16", public_subnet_cidr="10.43.0.0/20"), waiter_delay=0)
    assert counts() == before


def test_adopted_vpc_gets_only_security_groups_and_survives_teardown(aws, stack, counts):
    from pcflow.aws.teardown import Selector, teardown

    vpc_id = aws.ec2.create_vpc(CidrBlock="10.77.0.0/16")["Vpc"]["VpcId"]
    subnet_id = aws.ec2.create_subnet(VpcId=vpc_id, CidrBlock="10.77.1.0/24")["Subnet"]["SubnetId"]
    try:
        ids = ensure_network(aws.ec2, spec(stack, vpc_id=vpc_id, public_subnet_id=subnet_id), waiter_delay=0)
        assert ids.adopted and ids.vpc_id == vpc_id and ids.compute_subnet_ids == (subnet_id,)
        assert counts()["security-group"] == 2 and counts()["vpc"] == 0
        teardown(aws, Selector(stack=stack), pass_delay=0)
        assert set(counts().values()) == {0}
        assert aws.ec2.describe_vpcs(VpcIds=[vpc_id])["Vpcs"]
        assert aws.ec2.describe_subnets(SubnetIds=[subnet_id])["Subnets"]
        with pytest.raises(ValueError, match="does not exist"):
            ensure_network(aws.ec2, spec(stack, vpc_id="vpc-0000dead", public_subnet_id=subnet_id), waiter_delay=0)
    finally:
        aws.ec2.delete_subnet(SubnetId=subnet_id)
        aws.ec2.delete_vpc(VpcId=vpc_id)


def test_every_ensure_stamps_the_expiry_of_each_network_resource_again(aws, stack):
    """A kept network (a nightly's) lives its TTL past its last run: the second ensure, a night later
    with its TTL, moves `pcflow:expires` on for every resource of the network, NAT and its address too."""
    import datetime as dt

    from pcflow.aws.teardown import Selector, build_handlers
    from pcflow.naming import parse_expires

    ensure_network(aws.ec2, spec(stack, nat_gateway=True), ttl=dt.timedelta(hours=1), waiter_delay=0)
    ensure_network(aws.ec2, spec(stack, nat_gateway=True), ttl=dt.timedelta(hours=48), waiter_delay=0)
    listed = [r for handler in build_handlers(aws, ["ec2"]) for r in handler.list(Selector(stack=stack))]
    listed = [r for r in listed if r.tags]  # moto's NAT gateway leaves an untagged interface in the VPC
    kinds = {"vpc", "subnet", "internet-gateway", "route-table", "vpc-endpoint", "security-group"}
    assert {r.kind for r in listed} == kinds | {"nat-gateway", "elastic-ip"}
    (expires,) = {r.tags["pcflow:expires"] for r in listed}
    assert parse_expires(expires) > dt.datetime.now(dt.UTC) + dt.timedelta(hours=47)
