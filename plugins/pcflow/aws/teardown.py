"""Teardown as a convergence loop (aws-nuke's engine, cloud-nuke's VPC order).

One pass: list every selected resource by tag, try to delete each in the best-known order, treat
dependency errors as "later", list again. Loop until nothing is left (success) or until passes stop
changing anything (then report what is left, with each resource's last error, and fail). A resource
already gone counts as deleted. Dry-run lists and reports without deleting.

Resource kinds are pluggable: a handler lists and deletes one kind; handler sets are registered by
name (`register_handlers`) so another stage (e.g. the cluster owner's ParallelCluster stacks) can add
its kind to the same loop without touching this module.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from pcflow.aws.clients import AwsCallFailed, error_code, error_message
from pcflow.aws.tags import tag_dict
from pcflow.naming import TAG_COMPONENT, TAG_RUN, TAG_STACK, validate_stack_name

log = logging.getLogger(__name__)

#: Errors meaning "try again after something else is gone".
RETRYABLE_CODES = frozenset(
    {
        "DependencyViolation",
        "InvalidParameterValue",
        "ResourceInUse",
        "InvalidIPAddress.InUse",
        "InvalidNetworkInterface.InUse",
        "BadRequest",
        "IncorrectState",
        "InvalidState",
    }
)


def is_gone(code: str, message: str = "", resource_id: str | None = None) -> bool:
    """An error saying the resource itself does not exist: its deletion already happened.

    A NotFound about *another* id (e.g. a route table an endpoint still references) is not "gone";
    misjudging is harmless anyway, because every deletion is confirmed by listing again."""
    if code in {"NoSuchBucket", "InvalidAMIID.Unavailable"}:
        return True
    if not code.endswith("NotFound"):
        return False
    return resource_id is None or not message or resource_id in message


def is_retryable(code: str) -> bool:
    return code in RETRYABLE_CODES or code.endswith("InUse") or code.endswith(".InUse")


@dataclass(frozen=True)
class Resource:
    """One listed resource; `state` lets the loop see progress in async deletions (shutting-down...)."""

    kind: str
    id: str
    tags: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)
    state: str = ""
    detail: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.id)

    def describe(self) -> str:
        return f"{self.kind} {self.id}" + (f" ({self.state})" if self.state else "")


@dataclass(frozen=True)
class Selector:
    """Which pcflow resources a teardown or the janitor acts on.

    `stack=None` means every pcflow stack (the janitor); `predicate` is a last, client-side test on the
    tags (e.g. "expired"). EC2 listing is narrowed server-side with the equivalent filters.
    """

    stack: str | None = None
    run: str | None = None
    components: frozenset[str] | None = None
    predicate: Callable[[Mapping[str, str]], bool] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.stack is not None:
            validate_stack_name(self.stack)
        if self.components is not None:
            object.__setattr__(self, "components", frozenset(str(c) for c in self.components))

    def ec2_filters(self) -> list[dict[str, Any]]:
        if self.stack is not None:
            filters = [{"Name": f"tag:{TAG_STACK}", "Values": [self.stack]}]
        else:
            filters = [{"Name": "tag-key", "Values": [TAG_STACK]}]
        if self.run is not None:
            filters.append({"Name": f"tag:{TAG_RUN}", "Values": [self.run]})
        if self.components is not None:
            filters.append({"Name": f"tag:{TAG_COMPONENT}", "Values": sorted(self.components)})
        return filters

    def matches(self, tags: Mapping[str, str]) -> bool:
        if TAG_STACK not in tags or (self.stack is not None and tags[TAG_STACK] != self.stack):
            return False
        if self.run is not None and tags.get(TAG_RUN) != self.run:
            return False
        if self.components is not None and tags.get(TAG_COMPONENT) not in self.components:
            return False
        return self.predicate is None or bool(self.predicate(tags))


class ResourceHandler(Protocol):
    """Lists and deletes one kind of resource. Lower `order` is deleted earlier in each pass."""

    kind: str
    order: int

    def list(self, selector: Selector) -> list[Resource]: ...

    def prepare(self, resources: Sequence[Resource]) -> None: ...

    def delete(self, resource: Resource) -> None: ...

    def holds(self, resources: Sequence[Resource]) -> dict[tuple[str, str], str]: ...


class Handler:
    """Convenience base: `prepare` does nothing unless a kind needs a whole-batch step first; `holds`
    names listed resources that must not go yet (none, unless a kind can hold data not saved elsewhere)."""

    kind: ClassVar[str] = ""
    order: ClassVar[int] = 0

    def prepare(self, resources: Sequence[Resource]) -> None:
        return None

    def holds(self, resources: Sequence[Resource]) -> dict[tuple[str, str], str]:
        return {}


@dataclass
class TeardownReport:
    """What a teardown (or a dry run) did; `to_xcom` is small and free of secrets."""

    dry_run: bool
    passes: int = 0
    deleted: list[Resource] = field(default_factory=list)
    would_delete: list[Resource] = field(default_factory=list)
    remaining: list[Resource] = field(default_factory=list)
    errors: dict[tuple[str, str], str] = field(default_factory=dict)
    #: Resources kept because something they go with must not be deleted yet, and why.
    held: list[Resource] = field(default_factory=list)
    hold_reasons: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.dry_run or not (self.remaining or self.held)

    def summary(self) -> str:
        if self.dry_run:
            lines = [f"dry run: would delete {len(self.would_delete)} resource(s)"]
            lines += [f"  {r.describe()}" for r in self.would_delete]
        else:
            lines = [f"deleted {len(self.deleted)} resource(s) in {self.passes} pass(es)"]
        if self.remaining:
            lines.append(f"{len(self.remaining)} resource(s) could not be deleted:")
            lines += [f"  {r.describe()}: {self.errors.get(r.key, 'still listed')}" for r in self.remaining]
        if self.held:
            lines.append(f"{len(self.held)} resource(s) kept on purpose, with what they belong to:")
            lines += [f"  {reason}" for reason in self.hold_reasons]
            lines += [f"  kept: {r.describe()}" for r in self.held]
        return "\n".join(lines)

    def to_xcom(self) -> dict[str, Any]:
        def ids(resources: Iterable[Resource]) -> list[dict[str, str]]:
            return [{"kind": r.kind, "id": r.id} for r in resources]

        return {
            "dry_run": self.dry_run,
            "passes": self.passes,
            "deleted": ids(self.deleted),
            "would_delete": ids(self.would_delete),
            "remaining": [
                {"kind": r.kind, "id": r.id, "error": self.errors.get(r.key, "still listed")} for r in self.remaining
            ],
            "held": ids(self.held),
            "hold_reasons": list(self.hold_reasons),
        }


class TeardownIncomplete(RuntimeError):
    """Raised when the loop stopped with resources left; carries the report."""

    def __init__(self, report: TeardownReport):
        advice = "\nFix the errors above (or delete those resources by hand) and run the teardown again."
        if report.held:
            advice += (
                "\nKept resources: fix what FSx reports, run the cluster's delete task again (it exports first, "
                "then deletes the cluster), then this teardown; see the README, 'When the export before delete fails'."
            )
        super().__init__(report.summary() + advice)
        self.report = report


def _list_all(handlers: Sequence[ResourceHandler], selector: Selector) -> dict[tuple[str, str], Resource]:
    listed: dict[tuple[str, str], Resource] = {}
    for handler in handlers:
        for resource in handler.list(selector):
            listed[resource.key] = resource
    return listed


def _fingerprint(listed: Mapping[tuple[str, str], Resource]) -> frozenset[tuple[str, str, str]]:
    return frozenset((r.kind, r.id, r.state) for r in listed.values())


def converge(
    handlers: Iterable[ResourceHandler],
    selector: Selector,
    *,
    dry_run: bool = False,
    max_passes: int = 30,
    patience: int = 2,
    pass_delay: float = 5.0,
    sleep: Callable[[float], None] = time.sleep,
    logger: logging.Logger | logging.LoggerAdapter = log,
) -> TeardownReport:
    """Delete everything `selector` picks until nothing is left or nothing changes; never raises for a
    resource that will not go (it is in the report's `remaining`), only for a failed listing.

    A resource a handler holds (an FSx file system whose export to S3 failed) keeps everything of its
    owner, the same stack and run, out of the loop: its cluster and network stay with it (`held`)."""
    ordered = sorted(handlers, key=lambda h: h.order)
    report = TeardownReport(dry_run=dry_run)
    listed = _list_all(ordered, selector)
    held_owners = _held_owners(ordered, listed, report)
    listed = _without_held(listed, held_owners, report)
    if dry_run:
        report.would_delete = sorted(listed.values(), key=lambda r: _order_of(ordered, r))
        logger.info("%s", report.summary())
        return report
    stale = 0
    while listed and report.passes < max_passes:
        report.passes += 1
        logger.info("teardown pass %s: %s resource(s) listed", report.passes, len(listed))
        for handler in ordered:
            batch = [r for r in listed.values() if r.kind == handler.kind]
            if not batch:
                continue
            _attempt(lambda h=handler, b=batch: h.prepare(b), batch, report, logger)
            for resource in batch:
                _attempt(lambda h=handler, r=resource: h.delete(r), [resource], report, logger)
        relisted = _without_held(_list_all(ordered, selector), held_owners)
        gone = [r for key, r in listed.items() if key not in relisted]
        for resource in gone:
            report.errors.pop(resource.key, None)
            logger.info("confirmed deleted: %s", resource.describe())
        report.deleted.extend(gone)
        progress = _fingerprint(relisted) != _fingerprint(listed)
        listed = relisted
        if not listed:
            break
        stale = 0 if progress else stale + 1
        if stale > patience:
            break
        logger.info("teardown pass %s: %s left, waiting %ss", report.passes, len(listed), pass_delay)
        sleep(pass_delay)
    report.remaining = sorted(listed.values(), key=lambda r: _order_of(ordered, r))
    logger.info("%s", report.summary())
    return report


def _owner(resource: Resource) -> tuple[str | None, str | None]:
    return resource.tags.get(TAG_STACK), resource.tags.get(TAG_RUN)


def _held_owners(
    handlers: Sequence[ResourceHandler], listed: Mapping[tuple[str, str], Resource], report: TeardownReport
) -> set[tuple[str | None, str | None]]:
    """The (stack, run) owners of resources a handler holds; their reasons go in the report."""
    owners = set()
    for handler in handlers:
        batch = [r for r in listed.values() if r.kind == handler.kind]
        for key, reason in (handler.holds(batch) if batch else {}).items():
            owners.add(_owner(listed[key]))
            report.hold_reasons.append(reason)
    return owners


def _without_held(
    listed: dict[tuple[str, str], Resource],
    owners: set[tuple[str | None, str | None]],
    report: TeardownReport | None = None,
) -> dict[tuple[str, str], Resource]:
    """`listed` less everything of a held owner (recorded in `report.held` the first time)."""
    kept = {key: r for key, r in listed.items() if _owner(r) not in owners}
    if report is not None:
        report.held = [r for key, r in listed.items() if key not in kept]
    return kept


def _order_of(handlers: Sequence[ResourceHandler], resource: Resource) -> tuple[int, str]:
    for handler in handlers:
        if handler.kind == resource.kind:
            return (handler.order, resource.id)
    return (10**6, resource.id)


def _attempt(
    action: Callable[[], None],
    resources: Sequence[Resource],
    report: TeardownReport,
    logger: logging.Logger | logging.LoggerAdapter,
) -> None:
    from botocore.exceptions import ClientError

    try:
        action()
    except (ClientError, AwsCallFailed) as error:
        code = error_code(error)
        if len(resources) == 1 and is_gone(code, error_message(error), resources[0].id):
            return
        message = f"{code}: {error_message(error)}"
        for resource in resources:
            report.errors[resource.key] = message
        if is_retryable(code):
            logger.info("%s not deletable yet (%s); retrying next pass", resources[0].describe(), code)
        else:
            logger.warning("%s: %s", resources[0].describe(), message)


# --- EC2 / VPC handlers, in cloud-nuke's order -------------------------------------------------


def _paginate(client: Any, operation: str, result_key: str, **kwargs: Any) -> list[dict[str, Any]]:
    if client.can_paginate(operation):
        items: list[dict[str, Any]] = []
        for page in client.get_paginator(operation).paginate(**kwargs):
            items.extend(page.get(result_key, []))
        return items
    return list(getattr(client, operation)(**kwargs).get(result_key, []))


class _Ec2Handler(Handler):
    def __init__(self, ec2: Any):
        self.ec2 = ec2


class InstanceHandler(_Ec2Handler):
    kind, order = "instance", 10
    LIVE = ("pending", "running", "stopping", "stopped", "shutting-down")

    def list(self, selector: Selector) -> list[Resource]:
        filters = [*selector.ec2_filters(), {"Name": "instance-state-name", "Values": list(self.LIVE)}]
        out = []
        for reservation in _paginate(self.ec2, "describe_instances", "Reservations", Filters=filters):
            for inst in reservation["Instances"]:
                tags = tag_dict(inst.get("Tags"))
                if selector.matches(tags):
                    out.append(Resource(self.kind, inst["InstanceId"], tags, inst["State"]["Name"], inst))
        return out

    def delete(self, resource: Resource) -> None:
        if resource.state != "shutting-down":
            self.ec2.terminate_instances(InstanceIds=[resource.id])


class FsxFileSystemHandler(Handler):
    """FSx file systems put ENIs in the subnet, so they go before subnets and security groups."""

    kind, order = "fsx-file-system", 20

    def __init__(self, fsx: Any):
        self.fsx = fsx

    def list(self, selector: Selector) -> list[Resource]:
        out = []
        for fs in _paginate(self.fsx, "describe_file_systems", "FileSystems"):
            tags = tag_dict(fs.get("Tags"))
            state = fs.get("Lifecycle", "")
            if selector.matches(tags) and state != "DELETED":
                out.append(Resource(self.kind, fs["FileSystemId"], tags, state, fs))
        return out

    def delete(self, resource: Resource) -> None:
        if resource.state != "DELETING":
            self.fsx.delete_file_system(FileSystemId=resource.id)

    def holds(self, resources: Sequence[Resource]) -> dict[tuple[str, str], str]:
        """A file system whose last export before delete did not succeed holds data nowhere else (the
        checkpoints written since the last export): it stays, and so does what its cluster needs."""
        from pcflow.aws.storage import last_export_before_delete

        held = {}
        for resource in resources:
            if resource.state == "DELETING":
                continue
            task = last_export_before_delete(self.fsx, resource.id)
            if task is not None and task["Lifecycle"] != "SUCCEEDED":
                reason = (task.get("FailureDetails") or {}).get("Message") or "no details"
                held[resource.key] = (
                    f"FSx {resource.id}: its export to S3 before delete ({task['TaskId']}) is {task['Lifecycle']}: "
                    f"{reason}; the file system, its cluster and their network are kept until an export succeeds"
                )
        return held


class VpcEndpointHandler(_Ec2Handler):
    kind, order = "vpc-endpoint", 30

    def list(self, selector: Selector) -> list[Resource]:
        out = []
        for ep in _paginate(self.ec2, "describe_vpc_endpoints", "VpcEndpoints", Filters=selector.ec2_filters()):
            tags = tag_dict(ep.get("Tags"))
            state = str(ep.get("State", "")).lower()
            if selector.matches(tags) and state not in ("deleted",):
                out.append(Resource(self.kind, ep["VpcEndpointId"], tags, state, ep))
        return out

    def delete(self, resource: Resource) -> None:
        from botocore.exceptions import ClientError

        try:
            response = self.ec2.delete_vpc_endpoints(VpcEndpointIds=[resource.id])
        except ClientError as error:
            if error_code(error) != "InvalidRouteTableID.NotFound":
                raise
            # The endpoint still lists a route table that is already gone: drop it, then delete.
            stale = [rt for rt in resource.detail.get("RouteTableIds", []) if rt in error_message(error)]
            self.ec2.modify_vpc_endpoint(VpcEndpointId=resource.id, RemoveRouteTableIds=stale)
            response = self.ec2.delete_vpc_endpoints(VpcEndpointIds=[resource.id])
        for failure in response.get("Unsuccessful", []):
            err = failure.get("Error", {})
            raise AwsCallFailed(err.get("Code", "Unsuccessful"), err.get("Message", "delete_vpc_endpoints failed"))


class NatGatewayHandler(_Ec2Handler):
    kind, order = "nat-gateway", 40

    def list(self, selector: Selector) -> list[Resource]:
        out = []
        for nat in _paginate(self.ec2, "describe_nat_gateways", "NatGateways", Filter=selector.ec2_filters()):
            tags = tag_dict(nat.get("Tags"))
            if selector.matches(tags) and nat.get("State") not in ("deleted", "failed"):
                out.append(Resource(self.kind, nat["NatGatewayId"], tags, nat.get("State", ""), nat))
        return out

    def delete(self, resource: Resource) -> None:
        if resource.state != "deleting":
            self.ec2.delete_nat_gateway(NatGatewayId=resource.id)


class ElasticIpHandler(_Ec2Handler):
    """Released after the NAT gateway that holds it is deleted (the release fails until then)."""

    kind, order = "elastic-ip", 45

    def list(self, selector: Selector) -> list[Resource]:
        out = []
        for addr in self.ec2.describe_addresses(Filters=selector.ec2_filters()).get("Addresses", []):
            tags = tag_dict(addr.get("Tags"))
            if selector.matches(tags):
                out.append(Resource(self.kind, addr["AllocationId"], tags, addr.get("AssociationId", ""), addr))
        return out

    def delete(self, resource: Resource) -> None:
        # An address held by a NAT gateway is freed by deleting the gateway (an earlier kind in the pass).
        if resource.detail.get("AssociationId") and resource.detail.get("InstanceId"):
            self.ec2.disassociate_address(AssociationId=resource.detail["AssociationId"])
        self.ec2.release_address(AllocationId=resource.id)


class RouteTableHandler(_Ec2Handler):
    kind, order = "route-table", 50

    def list(self, selector: Selector) -> list[Resource]:
        out = []
        for rt in _paginate(self.ec2, "describe_route_tables", "RouteTables", Filters=selector.ec2_filters()):
            tags = tag_dict(rt.get("Tags"))
            if selector.matches(tags) and not any(a.get("Main") for a in rt.get("Associations", [])):
                out.append(Resource(self.kind, rt["RouteTableId"], tags, str(len(rt.get("Associations", []))), rt))
        return out

    def delete(self, resource: Resource) -> None:
        for assoc in resource.detail.get("Associations", []):
            if not assoc.get("Main"):
                self.ec2.disassociate_route_table(AssociationId=assoc["RouteTableAssociationId"])
        self.ec2.delete_route_table(RouteTableId=resource.id)


class NetworkInterfaceHandler(_Ec2Handler):
    """Tagged ENIs, and detached ENIs left in selected VPCs (FSx, Lambda and crashed launches leave them)."""

    kind, order = "network-interface", 60

    def list(self, selector: Selector) -> list[Resource]:
        found = {}
        for eni in _paginate(
            self.ec2, "describe_network_interfaces", "NetworkInterfaces", Filters=selector.ec2_filters()
        ):
            found[eni["NetworkInterfaceId"]] = eni
        vpc_ids = [r.id for r in VpcHandler(self.ec2).list(selector)]
        if vpc_ids:
            filters = [{"Name": "vpc-id", "Values": vpc_ids}, {"Name": "status", "Values": ["available"]}]
            for eni in _paginate(self.ec2, "describe_network_interfaces", "NetworkInterfaces", Filters=filters):
                found[eni["NetworkInterfaceId"]] = eni
        # An interface carrying pcflow's tags answers to the selector like any resource (a kept cluster's
        # stays); an untagged one left detached in a selected VPC goes with its VPC.
        return [
            Resource(self.kind, eni_id, tags, eni.get("Status", ""), eni)
            for eni_id, eni in found.items()
            if TAG_STACK not in (tags := tag_dict(eni.get("TagSet"))) or selector.matches(tags)
        ]

    def delete(self, resource: Resource) -> None:
        attachment = resource.detail.get("Attachment") or {}
        if attachment.get("AttachmentId") and attachment.get("Status") in ("attached", "attaching"):
            self.ec2.detach_network_interface(AttachmentId=attachment["AttachmentId"], Force=True)
        self.ec2.delete_network_interface(NetworkInterfaceId=resource.id)


class SecurityGroupHandler(_Ec2Handler):
    """Rules of every selected group are revoked first, so groups that reference each other can go."""

    kind, order = "security-group", 70

    def list(self, selector: Selector) -> list[Resource]:
        out = []
        for sg in _paginate(self.ec2, "describe_security_groups", "SecurityGroups", Filters=selector.ec2_filters()):
            tags = tag_dict(sg.get("Tags"))
            if selector.matches(tags) and sg.get("GroupName") != "default":
                rules = len(sg.get("IpPermissions", [])) + len(sg.get("IpPermissionsEgress", []))
                out.append(Resource(self.kind, sg["GroupId"], tags, f"{rules} rules", sg))
        return out

    def prepare(self, resources: Sequence[Resource]) -> None:
        for resource in resources:
            if resource.detail.get("IpPermissions"):
                self.ec2.revoke_security_group_ingress(
                    GroupId=resource.id, IpPermissions=_clean_permissions(resource.detail["IpPermissions"])
                )
            if resource.detail.get("IpPermissionsEgress"):
                self.ec2.revoke_security_group_egress(
                    GroupId=resource.id, IpPermissions=_clean_permissions(resource.detail["IpPermissionsEgress"])
                )

    def delete(self, resource: Resource) -> None:
        self.ec2.delete_security_group(GroupId=resource.id)


def _clean_permissions(permissions: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Describe output -> revoke input (drop empty lists the API rejects)."""
    cleaned = []
    for perm in permissions:
        item = {k: v for k, v in perm.items() if v not in ([], None)}
        if "UserIdGroupPairs" in item:
            item["UserIdGroupPairs"] = [{"GroupId": p["GroupId"]} for p in item["UserIdGroupPairs"]]
        cleaned.append(item)
    return cleaned


class SubnetHandler(_Ec2Handler):
    kind, order = "subnet", 80

    def list(self, selector: Selector) -> list[Resource]:
        return [
            Resource(self.kind, s["SubnetId"], tags, s.get("State", ""))
            for s in _paginate(self.ec2, "describe_subnets", "Subnets", Filters=selector.ec2_filters())
            if selector.matches(tags := tag_dict(s.get("Tags")))
        ]

    def delete(self, resource: Resource) -> None:
        self.ec2.delete_subnet(SubnetId=resource.id)


class InternetGatewayHandler(_Ec2Handler):
    kind, order = "internet-gateway", 90

    def list(self, selector: Selector) -> list[Resource]:
        out = []
        for igw in _paginate(
            self.ec2, "describe_internet_gateways", "InternetGateways", Filters=selector.ec2_filters()
        ):
            tags = tag_dict(igw.get("Tags"))
            if selector.matches(tags):
                attached = ",".join(a["VpcId"] for a in igw.get("Attachments", []))
                out.append(Resource(self.kind, igw["InternetGatewayId"], tags, attached, igw))
        return out

    def delete(self, resource: Resource) -> None:
        for attachment in resource.detail.get("Attachments", []):
            self.ec2.detach_internet_gateway(InternetGatewayId=resource.id, VpcId=attachment["VpcId"])
        self.ec2.delete_internet_gateway(InternetGatewayId=resource.id)


class VpcHandler(_Ec2Handler):
    kind, order = "vpc", 100

    def list(self, selector: Selector) -> list[Resource]:
        return [
            Resource(self.kind, v["VpcId"], tags, v.get("State", ""))
            for v in _paginate(self.ec2, "describe_vpcs", "Vpcs", Filters=selector.ec2_filters())
            if selector.matches(tags := tag_dict(v.get("Tags")))
        ]

    def delete(self, resource: Resource) -> None:
        self.ec2.delete_vpc(VpcId=resource.id)


class ImageHandler(_Ec2Handler):
    """Baked AMIs: deregistered, then their snapshots deleted (a deregistered AMI's snapshots still bill)."""

    kind, order = "image", 110

    def list(self, selector: Selector) -> list[Resource]:
        images = self.ec2.describe_images(Owners=["self"], Filters=selector.ec2_filters()).get("Images", [])
        return [
            Resource(self.kind, img["ImageId"], tags, img.get("State", ""), img)
            for img in images
            if selector.matches(tags := tag_dict(img.get("Tags")))
        ]

    def delete(self, resource: Resource) -> None:
        from botocore.exceptions import ClientError

        snapshots = [
            m["Ebs"]["SnapshotId"]
            for m in resource.detail.get("BlockDeviceMappings", [])
            if m.get("Ebs", {}).get("SnapshotId")
        ]
        self.ec2.deregister_image(ImageId=resource.id)
        for snapshot_id in snapshots:
            try:
                self.ec2.delete_snapshot(SnapshotId=snapshot_id)
            except ClientError as error:
                if not is_gone(error_code(error), error_message(error), snapshot_id):
                    raise


class SnapshotHandler(_Ec2Handler):
    """Tagged snapshots whose image is gone (an image's own snapshots go with it in `ImageHandler`)."""

    kind, order = "snapshot", 120

    def list(self, selector: Selector) -> list[Resource]:
        snaps = _paginate(
            self.ec2, "describe_snapshots", "Snapshots", OwnerIds=["self"], Filters=selector.ec2_filters()
        )
        return [
            Resource(self.kind, s["SnapshotId"], tags, s.get("State", ""), s)
            for s in snaps
            if selector.matches(tags := tag_dict(s.get("Tags")))
        ]

    def delete(self, resource: Resource) -> None:
        self.ec2.delete_snapshot(SnapshotId=resource.id)


# --- the registry -------------------------------------------------------------------------------

#: `service name -> boto3 client`; handler factories take one so they can reach any service.
ClientSource = Callable[[str], Any]
HandlerFactory = Callable[[ClientSource], Iterable[ResourceHandler]]

_REGISTRY: dict[str, HandlerFactory] = {}
#: Handler sets registered by another module, imported when first asked for: a worker parses only its
#: DAG's file, which need not import that module (the `janitor` DAG does not import the cluster stage).
_REGISTERED_BY = {"pcluster": "pcflow.cluster.teardown"}


def register_handlers(name: str, factory: HandlerFactory, *, replace: bool = False) -> None:
    """Make a handler set available to `teardown(... handler_sets=[name])` and to the operators."""
    if name in _REGISTRY and not replace:
        raise ValueError(f"teardown handler set {name!r} is already registered")
    _REGISTRY[name] = factory


def registered_handler_sets() -> list[str]:
    return sorted(_REGISTRY)


def build_handlers(clients: ClientSource, handler_sets: Iterable[str]) -> list[ResourceHandler]:
    handlers: list[ResourceHandler] = []
    for name in handler_sets:
        if name not in _REGISTRY and name in _REGISTERED_BY:
            importlib.import_module(_REGISTERED_BY[name])
        if name not in _REGISTRY:
            known = sorted({*_REGISTRY, *_REGISTERED_BY})
            raise ValueError(f"unknown teardown handler set {name!r}; choose from: {', '.join(known)}")
        handlers.extend(_REGISTRY[name](clients))
    return handlers


def _network_handlers(clients: ClientSource) -> list[ResourceHandler]:
    ec2 = clients("ec2")
    return [
        cls(ec2)
        for cls in (
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
    ]


register_handlers("ec2", _network_handlers)
register_handlers("fsx", lambda clients: [FsxFileSystemHandler(clients("fsx"))])
register_handlers("images", lambda clients: [ImageHandler(clients("ec2")), SnapshotHandler(clients("ec2"))])

#: What a stage's teardown deletes unless its policy says more: AMIs are kept (reused by recipe hash).
DEFAULT_HANDLER_SETS = ("ec2", "fsx")


def teardown(
    clients: ClientSource,
    selector: Selector,
    *,
    handler_sets: Iterable[str] = DEFAULT_HANDLER_SETS,
    extra_handlers: Iterable[ResourceHandler] = (),
    dry_run: bool = False,
    raise_on_leftovers: bool = True,
    **loop_options: Any,
) -> TeardownReport:
    """List-delete-relist until converged; raises `TeardownIncomplete` when something is left."""
    handlers = [*build_handlers(clients, handler_sets), *extra_handlers]
    report = converge(handlers, selector, dry_run=dry_run, **loop_options)
    if raise_on_leftovers and not report.complete:
        raise TeardownIncomplete(report)
    return report


# --- operator -----------------------------------------------------------------------------------

from pcflow.aws.base import PcflowAwsOperator  # noqa: E402 - the engine above stays importable without it


class TeardownOperator(PcflowAwsOperator):
    """Convergent teardown of a stack's (or one run's) tagged resources; fails with a report if any are left.

    Wire it as an Airflow teardown task so it runs when training fails. `handler_sets` names registered
    handler sets (`ec2`, `fsx`, `images`, or one another stage registered); AMIs are kept unless the
    teardown policy adds `images`. Returns `TeardownReport.to_xcom()`.
    """

    template_fields = (*PcflowAwsOperator.template_fields, "stack", "run", "components", "dry_run")
    ui_color = "#f4a6a6"

    def __init__(
        self,
        *,
        stack: str,
        run: str | None = None,
        components: Sequence[str] | None = None,
        handler_sets: Sequence[str] = DEFAULT_HANDLER_SETS,
        dry_run: bool = False,
        pass_delay: float = 5.0,
        max_passes: int = 30,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.stack = stack
        self.run = run
        self.components = components
        self.handler_sets = tuple(handler_sets)
        self.dry_run = dry_run
        self.pass_delay = pass_delay
        self.max_passes = max_passes

    def execute(self, context: Any) -> dict[str, Any]:
        selector = Selector(
            stack=self.stack,
            run=self.run or None,
            components=frozenset(self.components) if self.components else None,
        )
        report = teardown(
            self.client,
            selector,
            handler_sets=self.handler_sets,
            dry_run=bool(self.dry_run),
            pass_delay=self.pass_delay,
            max_passes=self.max_passes,
            logger=self.log,
        )
        return report.to_xcom()
