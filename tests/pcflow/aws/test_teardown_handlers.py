"""The list-by-tag base of the teardown handlers, offline: botocore's Stubber stands for the service and
checks each call's arguments against the service's model. Every page is read, the server-side filters
are the selector's, and what the server returns anyway (a service without tag filters, another stack's
resource, a default group, a deleted endpoint) is dropped on the client. Under a second."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from pcflow.aws.teardown.handlers import (
    FsxFileSystemHandler,
    ListByTagHandler,
    NatGatewayHandler,
    NetworkInterfaceHandler,
    SubnetHandler,
    VpcHandler,
)
from pcflow.aws.teardown.model import Selector

STACK, OTHER = "demo", "other"
SELECTOR = Selector(stack=STACK)
FILTERS = [{"Name": "tag:pcflow:stack", "Values": [STACK]}]


def tags(stack: str | None, **extra: str) -> list[dict[str, str]]:
    pairs = ({"pcflow:stack": stack} if stack else {}) | extra
    return [{"Key": k, "Value": v} for k, v in pairs.items()]


@pytest.fixture
def stubbed():
    """`service -> (client, stubber)`; every stubbed call must be made, and no other."""
    made: dict[str, tuple[Any, Stubber]] = {}

    def client(service: str) -> tuple[Any, Stubber]:
        if service not in made:
            real = boto3.client(service, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
            made[service] = (real, Stubber(real))
            made[service][1].activate()
        return made[service]

    yield client
    for _, stubber in made.values():
        stubber.assert_no_pending_responses()
        stubber.deactivate()


def test_every_page_is_read_with_the_selectors_filters_and_others_dropped(stubbed):
    ec2, stub = stubbed("ec2")
    first = [{"SubnetId": "subnet-1", "State": "available", "Tags": tags(STACK)}]
    second = [
        {"SubnetId": "subnet-2", "State": "pending", "Tags": tags(STACK, **{"pcflow:run": "r1"})},
        {"SubnetId": "subnet-3", "State": "available", "Tags": tags(OTHER)},  # a server ignoring the filter
        {"SubnetId": "subnet-4", "State": "available"},  # untagged: never pcflow's
    ]
    stub.add_response("describe_subnets", {"Subnets": first, "NextToken": "page-2"}, {"Filters": FILTERS})
    stub.add_response("describe_subnets", {"Subnets": second}, {"Filters": FILTERS, "NextToken": "page-2"})
    listed = SubnetHandler(ec2).list(SELECTOR)
    assert [(r.kind, r.id, r.state) for r in listed] == [
        ("subnet", "subnet-1", "available"),
        ("subnet", "subnet-2", "pending"),
    ]
    assert listed[1].tags == {"pcflow:stack": STACK, "pcflow:run": "r1"} and listed[1].detail["SubnetId"] == "subnet-2"


def test_a_kind_names_its_own_filter_argument_and_skips_what_is_gone(stubbed):
    ec2, stub = stubbed("ec2")
    gateways = [
        {"NatGatewayId": "nat-1", "State": "available", "Tags": tags(STACK)},
        {"NatGatewayId": "nat-2", "State": "deleted", "Tags": tags(STACK)},
    ]
    stub.add_response("describe_nat_gateways", {"NatGateways": gateways}, {"Filter": FILTERS})
    assert [(r.id, r.state) for r in NatGatewayHandler(ec2).list(SELECTOR)] == [("nat-1", "available")]


def test_a_service_without_tag_filters_is_selected_on_the_client(stubbed):
    fsx, stub = stubbed("fsx")
    systems = [
        {"FileSystemId": "fs-00000000000000001", "Lifecycle": "AVAILABLE", "Tags": tags(STACK)},
        {"FileSystemId": "fs-00000000000000002", "Lifecycle": "AVAILABLE", "Tags": tags(OTHER)},
        {"FileSystemId": "fs-00000000000000003", "Lifecycle": "DELETED", "Tags": tags(STACK)},
    ]
    stub.add_response("describe_file_systems", {"FileSystems": systems}, {})
    assert [(r.id, r.state) for r in FsxFileSystemHandler(fsx).list(SELECTOR)] == [
        ("fs-00000000000000001", "AVAILABLE")
    ]


def test_only_pcflow_s_tagged_interfaces_are_listed(stubbed):
    """An untagged interface in pcflow's VPC (a NAT gateway's, FSx's, Lambda's: AWS's own) is not
    deleted: the Airflow policy allows deleting tagged interfaces only (the rehearsal's recorded calls
    found the teardown deleting one it may not)."""
    ec2, stub = stubbed("ec2")
    listed = [
        {"NetworkInterfaceId": "eni-1", "Status": "in-use", "TagSet": tags(STACK)},
        {"NetworkInterfaceId": "eni-3", "Status": "available", "TagSet": tags(OTHER)},
    ]
    stub.add_response("describe_network_interfaces", {"NetworkInterfaces": listed}, {"Filters": FILTERS})
    assert [(r.id, r.state) for r in NetworkInterfaceHandler(ec2).list(SELECTOR)] == [("eni-1", "in-use")]
    stub.assert_no_pending_responses()


def test_a_new_kind_is_a_call_and_its_fields():
    """What another stage writes for its own kind: the listing, tags and selection come from the base."""

    class Pages:
        def can_paginate(self, operation: str) -> bool:
            return False

        def describe_widgets(self, **arguments: Any) -> dict[str, Any]:
            assert arguments == {"Filters": FILTERS}
            return {"Widgets": [{"WidgetId": "w-1", "Phase": "ready", "Labels": tags(STACK)}]}

    class WidgetHandler(ListByTagHandler):
        kind, order = "widget", 1
        operation, result_key, id_key, tags_key, state_key = (
            "describe_widgets",
            "Widgets",
            "WidgetId",
            "Labels",
            "Phase",
        )

        def delete(self, resource):  # not called here
            raise AssertionError

    assert [(r.kind, r.id, r.state) for r in WidgetHandler(Pages()).list(SELECTOR)] == [("widget", "w-1", "ready")]
    assert VpcHandler.tags_key == "Tags" and VpcHandler.state_key == "State"
