"""Fixtures for the AWS stages: retrying clients on the moto server of the local stack (over HTTPS,
through the `aws_default` connection), a unique stack name per test, and direct resource counts."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from dagrun import delete_bucket

from pcflow.aws.clients import aws_client
from pcflow.aws.teardown import Selector, teardown


@dataclass
class Clients:
    ec2: Any
    s3: Any
    ssm: Any
    iam: Any
    fsx: Any
    sts: Any
    cloudwatch: Any
    tagging: Any
    _cache: dict[str, str] = field(default_factory=dict, repr=False)

    def __call__(self, service: str) -> Any:
        """The `ClientSource` shape the teardown engine takes."""
        return getattr(self, service)

    def amazon_image_id(self) -> str:
        """An Amazon-owned image to launch instances from, looked up once per session: moto answers
        `describe_images(Owners=["amazon"])` with its whole catalogue (~1300 images, over a second per
        call, MaxResults notwithstanding); its catalogue ids are fixed (they survive a reset)."""
        if "image" not in self._cache:
            self._cache["image"] = self.ec2.describe_images(Owners=["amazon"], MaxResults=5)["Images"][0]["ImageId"]
        return self._cache["image"]

    def account_id(self) -> str:
        if "account" not in self._cache:
            self._cache["account"] = self.sts.get_caller_identity()["Account"]
        return self._cache["account"]


@pytest.fixture(scope="session")
def aws(local_stack) -> Clients:
    services = ("ec2", "s3", "ssm", "iam", "fsx", "sts", "cloudwatch")
    made = {s: aws_client(s, aws_conn_id="aws_default") for s in services}
    return Clients(**made, tagging=aws_client("resourcegroupstaggingapi", aws_conn_id="aws_default"))


@pytest.fixture
def stack(aws) -> str:
    """A stack name no other test (or engineer) uses; whatever the test leaves is torn down after it."""
    name = f"t{uuid.uuid4().hex[:12]}"
    yield name
    teardown(aws, Selector(stack=name), handler_sets=("ec2", "images"), pass_delay=0, raise_on_leftovers=False)


@pytest.fixture
def bucket(aws) -> str:
    """A data bucket of the test's own, for the markers pcflow keeps in a stack's bucket (network references,
    locks); deleted with everything in it after the test."""
    name = f"pcflow-refs-{uuid.uuid4().hex[:10]}"
    aws.s3.create_bucket(Bucket=name)
    yield name
    delete_bucket(aws.s3, name)


def count_by_kind(ec2: Any, stack: str, account_id: str | None = None) -> dict[str, int]:
    """Direct describe calls per resource type (independent of the code under test's handlers).

    Cheap filters go first: moto applies filters in order and resolves a `tag:` filter by scanning
    every tag it holds, per candidate; it also ignores `OwnerIds`, so without `owner-id` (what `self`
    means: the caller's account) it tag-scans its ~1300 catalogue snapshots, seconds per call."""
    flt = [{"Name": "tag:pcflow:stack", "Values": [stack]}]
    own = [{"Name": "owner-id", "Values": [account_id]}] if account_id else []
    live = ["pending", "running", "stopping", "stopped", "shutting-down"]
    counts = {
        "vpc": len(ec2.describe_vpcs(Filters=flt)["Vpcs"]),
        "subnet": len(ec2.describe_subnets(Filters=flt)["Subnets"]),
        "internet-gateway": len(ec2.describe_internet_gateways(Filters=flt)["InternetGateways"]),
        "route-table": len(ec2.describe_route_tables(Filters=flt)["RouteTables"]),
        "security-group": len(ec2.describe_security_groups(Filters=flt)["SecurityGroups"]),
        "vpc-endpoint": len(
            [e for e in ec2.describe_vpc_endpoints(Filters=flt)["VpcEndpoints"] if e["State"].lower() != "deleted"]
        ),
        "nat-gateway": len(
            [n for n in ec2.describe_nat_gateways(Filter=flt)["NatGateways"] if n["State"] not in ("deleted",)]
        ),
        "elastic-ip": len(ec2.describe_addresses(Filters=flt)["Addresses"]),
        "instance": sum(
            len(r["Instances"])
            for r in ec2.describe_instances(Filters=[{"Name": "instance-state-name", "Values": live}, *flt])[
                "Reservations"
            ]
        ),
        "image": len(ec2.describe_images(Owners=["self"], Filters=flt)["Images"]),
        "snapshot": len(ec2.describe_snapshots(OwnerIds=["self"], Filters=[*own, *flt])["Snapshots"]),
    }
    return counts


def tagged_arns(tagging: Any, stack: str) -> list[str]:
    """What the resource groups tagging API still lists for the stack (excluding terminated instances,
    which AWS keeps listing for an hour)."""
    arns = []
    for page in tagging.get_paginator("get_resources").paginate(
        TagFilters=[{"Key": "pcflow:stack", "Values": [stack]}]
    ):
        arns += [m["ResourceARN"] for m in page["ResourceTagMappingList"]]
    return arns


@pytest.fixture
def counts(aws, stack):
    """`counts()` -> resources of the test's stack per type, by direct describe calls."""
    account_id = aws.account_id()
    return lambda: count_by_kind(aws.ec2, stack, account_id)


@pytest.fixture
def arns(aws, stack):
    """`arns()` -> ARNs the tagging API lists for the test's stack."""
    return lambda: tagged_arns(aws.tagging, stack)
