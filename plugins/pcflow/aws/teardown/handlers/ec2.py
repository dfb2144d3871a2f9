"""The EC2 and VPC kinds, in cloud-nuke's order: what runs in the network goes before the network."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pcflow.aws.clients import AwsCallFailed, error_code, error_message
from pcflow.aws.teardown.handlers.base import ListByTagHandler
from pcflow.aws.teardown.model import Resource, Selector


class InstanceHandler(ListByTagHandler):
    """Instances first, so what they use (ENIs, groups, subnets) can go; only live states are listed, so a
    terminated instance counts as gone."""

    kind, order = "instance", 10
    operation, result_key, id_key = "describe_instances", "Reservations", "InstanceId"
    LIVE = ("pending", "running", "stopping", "stopped", "shutting-down")

    def describe(self, selector: Selector) -> list[dict[str, Any]]:
        return [instance for reservation in super().describe(selector) for instance in reservation["Instances"]]

    def arguments(self, selector: Selector) -> dict[str, Any]:
        return {"Filters": [*selector.ec2_filters(), {"Name": "instance-state-name", "Values": list(self.LIVE)}]}

    def state(self, item: dict[str, Any]) -> str:
        return item["State"]["Name"]

    def delete(self, resource: Resource) -> None:
        """Terminate, unless already shutting down (termination is asynchronous: the next pass sees it go)."""
        if resource.state != "shutting-down":
            self.client.terminate_instances(InstanceIds=[resource.id])


class VpcEndpointHandler(ListByTagHandler):
    """The S3 gateway endpoint; one that lists an already deleted route table is freed of it first."""

    kind, order = "vpc-endpoint", 30
    operation, result_key, id_key = "describe_vpc_endpoints", "VpcEndpoints", "VpcEndpointId"

    def selects(self, selector: Selector, item: dict[str, Any], tags: dict[str, str]) -> bool:
        return selector.matches(tags) and self.state(item) != "deleted"

    def state(self, item: dict[str, Any]) -> str:
        return str(item.get("State", "")).lower()

    def delete(self, resource: Resource) -> None:
        """Delete the endpoint; AWS's per-endpoint refusal in a 200 answer is raised as a failed call, so the
        loop sees it."""
        from botocore.exceptions import ClientError

        try:
            response = self.client.delete_vpc_endpoints(VpcEndpointIds=[resource.id])
        except ClientError as error:
            if error_code(error) != "InvalidRouteTableID.NotFound":
                raise
            # The endpoint still lists a route table that is already gone: drop it, then delete.
            stale = [rt for rt in resource.detail.get("RouteTableIds", []) if rt in error_message(error)]
            self.client.modify_vpc_endpoint(VpcEndpointId=resource.id, RemoveRouteTableIds=stale)
            response = self.client.delete_vpc_endpoints(VpcEndpointIds=[resource.id])
        for failure in response.get("Unsuccessful", []):
            err = failure.get("Error", {})
            raise AwsCallFailed(err.get("Code", "Unsuccessful"), err.get("Message", "delete_vpc_endpoints failed"))


class NatGatewayHandler(ListByTagHandler):
    """NAT gateways, before their elastic IPs and subnets; a gateway being deleted is left to finish."""

    kind, order = "nat-gateway", 40
    operation, result_key, id_key = "describe_nat_gateways", "NatGateways", "NatGatewayId"

    def arguments(self, selector: Selector) -> dict[str, Any]:
        return {"Filter": selector.ec2_filters()}  # this call alone spells it in the singular

    def selects(self, selector: Selector, item: dict[str, Any], tags: dict[str, str]) -> bool:
        return selector.matches(tags) and item.get("State") not in ("deleted", "failed")

    def delete(self, resource: Resource) -> None:
        """Delete, unless already deleting (asynchronous: the gateway's address is freed only when it is gone)."""
        if resource.state != "deleting":
            self.client.delete_nat_gateway(NatGatewayId=resource.id)


class ElasticIpHandler(ListByTagHandler):
    """Released after the NAT gateway that holds it is deleted (the release fails until then)."""

    kind, order = "elastic-ip", 45
    operation, result_key, id_key, state_key = "describe_addresses", "Addresses", "AllocationId", "AssociationId"

    def delete(self, resource: Resource) -> None:
        """Release the address, disassociating it from an instance first; one a NAT gateway holds fails until
        the gateway is gone."""
        # An address held by a NAT gateway is freed by deleting the gateway (an earlier kind in the pass).
        if resource.detail.get("AssociationId") and resource.detail.get("InstanceId"):
            self.client.disassociate_address(AssociationId=resource.detail["AssociationId"])
        self.client.release_address(AllocationId=resource.id)


class RouteTableHandler(ListByTagHandler):
    """pcflow's route tables, disassociated first; a VPC's main table is never listed (it goes with the VPC)."""

    kind, order = "route-table", 50
    operation, result_key, id_key = "describe_route_tables", "RouteTables", "RouteTableId"

    def selects(self, selector: Selector, item: dict[str, Any], tags: dict[str, str]) -> bool:
        return selector.matches(tags) and not any(a.get("Main") for a in item.get("Associations", []))

    def state(self, item: dict[str, Any]) -> str:
        return str(len(item.get("Associations", [])))

    def delete(self, resource: Resource) -> None:
        """Disassociate the table from its subnets, then delete it."""
        for assoc in resource.detail.get("Associations", []):
            if not assoc.get("Main"):
                self.client.disassociate_route_table(AssociationId=assoc["RouteTableAssociationId"])
        self.client.delete_route_table(RouteTableId=resource.id)


class NetworkInterfaceHandler(ListByTagHandler):
    """pcflow's tagged ENIs. Untagged ones in pcflow's VPCs are not pcflow's to delete: FSx's, Lambda's
    and a NAT gateway's are AWS's own (requester-managed, removed with their service; the VPC's deletion
    is retried until they are gone), and the Airflow role may delete only what carries pcflow's tags
    (include/iam/pcflow-airflow-policy.json), which the rehearsal's recorded calls check."""

    kind, order = "network-interface", 60
    operation, result_key, id_key = "describe_network_interfaces", "NetworkInterfaces", "NetworkInterfaceId"
    tags_key, state_key = "TagSet", "Status"

    def delete(self, resource: Resource) -> None:
        """Detach (forced) when still attached, then delete."""
        attachment = resource.detail.get("Attachment") or {}
        if attachment.get("AttachmentId") and attachment.get("Status") in ("attached", "attaching"):
            self.client.detach_network_interface(AttachmentId=attachment["AttachmentId"], Force=True)
        self.client.delete_network_interface(NetworkInterfaceId=resource.id)


class SecurityGroupHandler(ListByTagHandler):
    """Rules of every selected group are revoked first, so groups that reference each other can go."""

    kind, order = "security-group", 70
    operation, result_key, id_key = "describe_security_groups", "SecurityGroups", "GroupId"

    def selects(self, selector: Selector, item: dict[str, Any], tags: dict[str, str]) -> bool:
        return selector.matches(tags) and item.get("GroupName") != "default"

    def state(self, item: dict[str, Any]) -> str:
        return f"{len(item.get('IpPermissions', [])) + len(item.get('IpPermissionsEgress', []))} rules"

    def prepare(self, resources: Sequence[Resource]) -> None:
        """Revoke every rule of every selected group first: groups that reference each other could never go one
        by one."""
        for resource in resources:
            if resource.detail.get("IpPermissions"):
                self.client.revoke_security_group_ingress(
                    GroupId=resource.id, IpPermissions=_clean_permissions(resource.detail["IpPermissions"])
                )
            if resource.detail.get("IpPermissionsEgress"):
                self.client.revoke_security_group_egress(
                    GroupId=resource.id, IpPermissions=_clean_permissions(resource.detail["IpPermissionsEgress"])
                )

    def delete(self, resource: Resource) -> None:
        """Delete the group (its rules were revoked in `prepare`)."""
        self.client.delete_security_group(GroupId=resource.id)


def _clean_permissions(permissions: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Describe output -> revoke input (drop empty lists the API rejects)."""
    cleaned = []
    for perm in permissions:
        item = {k: v for k, v in perm.items() if v not in ([], None)}
        if "UserIdGroupPairs" in item:
            item["UserIdGroupPairs"] = [{"GroupId": p["GroupId"]} for p in item["UserIdGroupPairs"]]
        cleaned.append(item)
    return cleaned


class SubnetHandler(ListByTagHandler):
    """Subnets, once nothing runs in them."""

    kind, order = "subnet", 80
    operation, result_key, id_key = "describe_subnets", "Subnets", "SubnetId"

    def delete(self, resource: Resource) -> None:
        """Delete the subnet; while an ENI is left in it AWS refuses, which the loop reads as "later"."""
        self.client.delete_subnet(SubnetId=resource.id)


class InternetGatewayHandler(ListByTagHandler):
    """Internet gateways, detached from their VPC first (a VPC with one attached cannot be deleted)."""

    kind, order = "internet-gateway", 90
    operation, result_key, id_key = "describe_internet_gateways", "InternetGateways", "InternetGatewayId"

    def state(self, item: dict[str, Any]) -> str:
        return ",".join(a["VpcId"] for a in item.get("Attachments", []))

    def delete(self, resource: Resource) -> None:
        """Detach from every VPC, then delete."""
        for attachment in resource.detail.get("Attachments", []):
            self.client.detach_internet_gateway(InternetGatewayId=resource.id, VpcId=attachment["VpcId"])
        self.client.delete_internet_gateway(InternetGatewayId=resource.id)


class VpcHandler(ListByTagHandler):
    """The VPC last: it goes only once everything in it has (a dependency error means "later")."""

    kind, order = "vpc", 100
    operation, result_key, id_key = "describe_vpcs", "Vpcs", "VpcId"

    def delete(self, resource: Resource) -> None:
        """Delete the VPC; refused while anything is left in it, which the loop reads as "later"."""
        self.client.delete_vpc(VpcId=resource.id)


#: The network's kinds in cloud-nuke's order (what runs in it first); `order` sorts them in the loop.
NETWORK_HANDLERS = (
    InstanceHandler,
    VpcEndpointHandler,
    NatGatewayHandler,
    ElasticIpHandler,
    RouteTableHandler,
    NetworkInterfaceHandler,
    SecurityGroupHandler,
    SubnetHandler,
    InternetGatewayHandler,
    VpcHandler,
)
