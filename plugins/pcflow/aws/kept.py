"""What each resource pcflow keeps costs per day, for the janitor's report: the nightly's cluster, network
and image, a run kept for debugging until its TTL, the shared bucket's neighbours. Priced from the
region's dated table (pcflow/prices.json) and what the listing shows (instance type and state,
file system size, endpoint subnets, snapshot sizes, a bucket's stored bytes as pcflow.aws.kept_buckets
measured them); free kinds cost 0, and what the table cannot price says so instead of counting as 0.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pcflow.aws.teardown import Resource
from pcflow.prices import fsx_per_hour

HOURS_PER_DAY = 24
#: Kinds AWS does not bill for while they exist (a VPC, its subnets, gateways, tables, groups, interfaces).
FREE = frozenset(
    {"vpc", "subnet", "security-group", "internet-gateway", "route-table", "network-interface", "pcluster-cluster"}
)
Priced = tuple[float | None, str]


def _instance(resource: Resource, table: Mapping[str, Any]) -> Priced:
    detail = resource.detail
    if resource.state not in ("pending", "running"):
        return 0.0, f"{resource.state}: no instance hours (its volumes still bill)"
    kind = detail.get("InstanceType", "?")
    price = table.get("on_demand_per_hour", {}).get(kind)
    if price is None:
        return None, f"{kind} not in the price table"
    spot = " (on-demand price: a spot instance costs less)" if detail.get("InstanceLifecycle") == "spot" else ""
    return price * HOURS_PER_DAY, f"{kind} at ${price:g}/h{spot}"


def _file_system(resource: Resource, table: Mapping[str, Any]) -> Priced:
    lustre = resource.detail.get("LustreConfiguration") or {}
    kind = lustre.get("DeploymentType", "SCRATCH_2")
    if kind == "PERSISTENT_2":
        kind = f"PERSISTENT_2_{lustre.get('PerUnitStorageThroughput')}"
    gib = float(resource.detail.get("StorageCapacity") or 0)
    per_hour = fsx_per_hour(table, gib, kind)
    if per_hour is None:
        return None, f"FSx {kind} not in the price table"
    return per_hour * HOURS_PER_DAY, f"{gib:g} GiB {kind}"


def _hourly(key: str, what: str) -> Callable[[Resource, Mapping[str, Any]], Priced]:
    def price(resource: Resource, table: Mapping[str, Any]) -> Priced:
        per_hour = table.get(key)
        if per_hour is None:
            return None, f"{key} not in the price table"
        return per_hour * HOURS_PER_DAY, f"{what} at ${per_hour:g}/h"

    return price


def _endpoint(resource: Resource, table: Mapping[str, Any]) -> Priced:
    if resource.detail.get("VpcEndpointType", "Gateway") != "Interface":
        return 0.0, "gateway endpoint: free"
    zones = max(1, len(resource.detail.get("SubnetIds") or ()))
    per_hour = table.get("vpc_interface_endpoint_per_hour")
    if per_hour is None:
        return None, "vpc_interface_endpoint_per_hour not in the price table"
    return per_hour * zones * HOURS_PER_DAY, f"interface endpoint in {zones} zone(s) at ${per_hour:g}/h each"


def _per_day(per_month: float, table: Mapping[str, Any]) -> float:
    """A monthly price per day, by the table's hours in a month."""
    return per_month / float(table.get("hours_per_month", 730)) * HOURS_PER_DAY


def _snapshot_gib(gib: float, table: Mapping[str, Any], what: str) -> Priced:
    per_month = table.get("ebs_snapshot_per_gib_month")
    if per_month is None:
        return None, "ebs_snapshot_per_gib_month not in the price table"
    per_day = gib * _per_day(per_month, table)
    return per_day, f"{what}: {gib:g} GiB of snapshots (at most: they bill for the blocks they hold)"


def _image(resource: Resource, table: Mapping[str, Any]) -> Priced:
    mappings = resource.detail.get("BlockDeviceMappings") or []
    gib = sum(float(m.get("Ebs", {}).get("VolumeSize") or 0) for m in mappings)
    return _snapshot_gib(gib, table, "image")


def _snapshot(resource: Resource, table: Mapping[str, Any]) -> Priced:
    return _snapshot_gib(float(resource.detail.get("VolumeSize") or 0), table, "snapshot")


#: What S3 calls a GB when it bills storage: 2^30 bytes.
BYTES_PER_GIB = 2**30


def _bucket(resource: Resource, table: Mapping[str, Any]) -> Priced:
    """Stored bytes x the S3 Standard price per GB-month; a shared bucket's line is its stack's share."""
    detail = resource.detail
    if "Bytes" not in detail:
        return None, detail.get("SizeError", "size not known")
    per_month = table.get("s3_standard_per_gib_month")
    if per_month is None:
        return None, "s3_standard_per_gib_month not in the price table"
    gib = detail["Bytes"] / BYTES_PER_GIB
    users = len(detail.get("SharedBy") or ()) or 1
    per_day = gib * _per_day(per_month, table) / users
    at_least = "at least " if detail.get("AtLeast") else ""
    size = f"{at_least}{_size(detail['Bytes'])} in S3 Standard at ${per_month:g}/GiB-month"
    share = f"; 1/{users} of it: shared by {users} stacks" if users > 1 else ""
    return per_day, f"{size} ({detail['BytesSource']}){share}"


def _size(stored: int) -> str:
    for unit, size in (("GiB", BYTES_PER_GIB), ("MiB", 2**20)):
        if stored >= size:
            return f"{stored / size:,.1f} {unit}"
    return f"{stored:,} bytes"


def _unpriced(resource: Resource, table: Mapping[str, Any]) -> Priced:
    return None, f"no price for a {resource.kind}"


PRICERS: dict[str, Callable[[Resource, Mapping[str, Any]], Priced]] = {
    "instance": _instance,
    "fsx-file-system": _file_system,
    "nat-gateway": _hourly("nat_gateway_per_hour", "NAT gateway (plus data processed)"),
    "elastic-ip": _hourly("public_ipv4_per_hour", "public IPv4 address"),
    "vpc-endpoint": _endpoint,
    "image": _image,
    "snapshot": _snapshot,
    "bucket": _bucket,
}


def daily_costs(resources: Sequence[Resource], table: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One line per resource: what it is, its stack, USD per day (None: not priced) and the basis."""
    of_images = {
        m["Ebs"]["SnapshotId"]
        for r in resources
        if r.kind == "image"
        for m in r.detail.get("BlockDeviceMappings") or []
        if m.get("Ebs", {}).get("SnapshotId")
    }
    lines = []
    for resource in resources:
        if resource.kind in FREE:
            usd, basis = 0.0, "free"
        elif resource.kind == "snapshot" and resource.id in of_images:
            usd, basis = 0.0, "counted with its image"
        else:
            usd, basis = PRICERS.get(resource.kind, _unpriced)(resource, table)
        lines.append(
            {
                "kind": resource.kind,
                "id": resource.id,
                "stack": resource.tags.get("pcflow:stack"),
                "usd_per_day": round(usd, 4) if usd is not None else None,
                "basis": basis,
            }
        )
    return lines
