"""The stack's shared network with a compute subnet in each other availability zone its profile lists
(`network.zone_subnet_cidrs`, issue 27.3's other-AZ fallback), on the moto server: each zone's subnet is made
once in that zone, tagged as the network's, routed as compute's own; a retry adopts it; the last run's release
removes it with the rest, and never while another run references the network."""

from __future__ import annotations

import datetime as dt
import re
import uuid

import pytest
from dagrun import delete_bucket

from pcflow.aws.clients import aws_client
from pcflow.aws.network import ensure_network, release_network, use_network
from pcflow.aws.network_spec import NetworkSpec
from pcflow.aws.teardown import Selector, teardown
from pcflow.errors import ConfigurationError, PcflowInputError

pytestmark = pytest.mark.stack
TTL = dt.timedelta(hours=1)
ZONES = {"us-east-1b": "10.42.32.0/20", "us-east-1c": "10.42.48.0/20"}


class Clients:
    """The `ClientSource` shape release_network and the teardown take, on the local stack's moto server."""

    def __init__(self) -> None:
        self.ec2, self.s3 = aws_client("ec2"), aws_client("s3")

    def __call__(self, service: str):
        return getattr(self, service) if service in ("ec2", "s3") else aws_client(service)


@pytest.fixture(scope="module")
def aws(local_stack) -> Clients:
    return Clients()


@pytest.fixture
def stack(aws):
    name = f"t{uuid.uuid4().hex[:12]}"
    yield name
    teardown(aws, Selector(stack=name), handler_sets=("ec2",), pass_delay=0, raise_on_leftovers=False)


@pytest.fixture
def bucket(aws):
    name = f"pcflow-refs-{uuid.uuid4().hex[:10]}"
    aws.s3.create_bucket(Bucket=name)
    yield name
    delete_bucket(aws.s3, name)


def spec(stack: str, **values) -> NetworkSpec:
    values = {"availability_zone": "us-east-1a", "zone_subnet_cidrs": ZONES, **values}
    return NetworkSpec(stack=stack, region="us-east-1", **values)


def subnets(aws, stack: str) -> dict[str, dict]:
    """The stack's subnets by id, found by its tag (not by the code under test)."""
    found = aws.ec2.describe_subnets(Filters=[{"Name": "tag:pcflow:stack", "Values": [stack]}])["Subnets"]
    return {s["SubnetId"]: s for s in found}


def use(aws, stack: str, bucket: str, run: str, **values):
    dag_run = ("pretrain", f"manual__{run}")
    return use_network(
        aws.ec2, aws.s3, spec(stack, **values), bucket=bucket, run=run, ttl=TTL, dag_run=dag_run, waiter_delay=0
    )


def release(aws, stack: str, bucket: str, run: str) -> dict:
    return release_network(aws, stack=stack, bucket=bucket, run=run, pass_delay=0, lock_delay=0.05)


def test_each_listed_zone_gets_one_compute_subnet_there_and_a_retry_adopts_it(aws, stack, bucket):
    first = use(aws, stack, bucket, "run-a")
    assert sorted(first.zone_subnet_ids) == sorted(ZONES) and first.availability_zone == "us-east-1a"
    made = subnets(aws, stack)
    assert len(made) == 3  # the public subnet (head node, compute) and one per other zone
    for zone, subnet_id in first.zone_subnet_ids.items():
        subnet = made[subnet_id]
        assert (subnet["AvailabilityZone"], subnet["CidrBlock"]) == (zone, ZONES[zone])
        tags = {t["Key"]: t["Value"] for t in subnet["Tags"]}
        assert tags["pcflow:component"] == "network" and tags["Name"].endswith(f"zone-{zone}")
        assert "pcflow:run" not in tags  # the stack's network, not one run's
    routes = aws.ec2.describe_route_tables(RouteTableIds=list(first.route_table_ids))["RouteTables"]
    routed = {a.get("SubnetId") for table in routes for a in table.get("Associations", [])}
    assert set(first.zone_subnet_ids.values()) <= routed  # compute there reaches out as compute here does

    again = use(aws, stack, bucket, "run-a")  # the task's retry: same ids, nothing new
    second = use(aws, stack, bucket, "run-b")  # another run of the stack: the same network
    assert again.zone_subnet_ids == second.zone_subnet_ids == first.zone_subnet_ids
    assert subnets(aws, stack).keys() == made.keys()


def test_zone_subnets_stay_while_another_run_uses_the_network_and_go_with_the_last(aws, stack, bucket):
    ids = use(aws, stack, bucket, "run-a")
    use(aws, stack, bucket, "run-b")
    kept = release(aws, stack, bucket, "run-a")
    assert kept["network_deleted"] is False and kept["users"] == ["run-b"]
    assert set(ids.zone_subnet_ids.values()) <= subnets(aws, stack).keys()
    gone = release(aws, stack, bucket, "run-b")
    assert gone["network_deleted"] is True and subnets(aws, stack) == {}
    assert aws.ec2.describe_vpcs(Filters=[{"Name": "tag:pcflow:stack", "Values": [stack]}])["Vpcs"] == []


def test_behind_a_nat_gateway_the_zone_subnets_are_private_and_routed_through_it(aws, stack):
    ids = ensure_network(aws.ec2, spec(stack, nat_gateway=True), waiter_delay=0)
    made = subnets(aws, stack)
    assert not any(made[s]["MapPublicIpOnLaunch"] for s in ids.zone_subnet_ids.values())
    private = aws.ec2.describe_route_tables(RouteTableIds=[ids.route_table_ids[1]])["RouteTables"][0]
    assert {r.get("NatGatewayId") for r in private["Routes"]} >= {ids.nat_gateway_id}
    assert set(ids.zone_subnet_ids.values()) <= {a.get("SubnetId") for a in private["Associations"]}


def test_a_zone_the_region_lacks_or_the_networks_own_is_refused_before_anything_is_made(aws, stack):
    with pytest.raises(PcflowInputError, match="us-east-1z"):
        ensure_network(aws.ec2, spec(stack, zone_subnet_cidrs={"us-east-1z": "10.42.32.0/20"}), waiter_delay=0)
    with pytest.raises(PcflowInputError, match="the network's own zone"):
        ensure_network(aws.ec2, spec(stack, zone_subnet_cidrs={"us-east-1a": "10.42.32.0/20"}), waiter_delay=0)
    assert subnets(aws, stack) == {}


@pytest.mark.parametrize(
    ("zones", "message"),
    [
        ({"us-east-1b": "10.99.0.0/20"}, "network: zone_subnet_cidrs[us-east-1b] 10.99.0.0/20 is not inside vpc_cidr"),
        ({"us-east-1b": "10.42.0.0/24"}, "network: CIDR overlap"),
        ({"east": "10.42.32.0/20"}, "network.zone_subnet_cidrs: 'east' is not an availability zone"),
    ],
)
def test_zone_cidrs_are_checked_before_anything_is_made(zones, message):
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        NetworkSpec.of("tzones", "us-east-1", {"zone_subnet_cidrs": zones})
