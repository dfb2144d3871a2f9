"""The network stage: one VPC per stack, found by tags before anything is created.

Layout: a public subnet (head node; compute too unless a NAT gateway is asked for), an internet
gateway, route tables, an S3 gateway endpoint (dataset traffic skips NAT and its per-GB charge), and
two security groups: `head` (SSH from the configured CIDRs only; a ParallelCluster head node gets it
beside ParallelCluster's own, see aws/ssh_ingress.py) and `cluster` (all traffic between members).
With `nat_gateway=True`, compute gets private subnets routed through a NAT gateway. `zone_subnet_cidrs`
(zone -> CIDR) adds one compute subnet in each other availability zone it names, routed as compute's own
subnets are: where a capacity fallback option names that zone (pcflow.capacity), its queue launches there.

An existing VPC can be adopted by id: pcflow then only adds its tagged security groups there, and
the teardown (which deletes by tag) leaves the VPC and its subnets alone.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import conf

from pcflow.aws.base import PcflowAwsOperator, aws_template_fields
from pcflow.aws.clients import error_code, wait_logged
from pcflow.aws.network_users import (
    TAG_REFERENCES,
    drop_reference,
    lock_of,
    network_lock,
    references,
    take_reference,
    vpc_in_use,
)
from pcflow.aws.tags import find_one, refresh_expiry, tag_dict, tag_equals, tag_specifications
from pcflow.aws.teardown import DEFAULT_HANDLER_SETS, Selector, TeardownOperator, teardown
from pcflow.errors import PcflowInputError, ResourceConflict, profile_setting, refused
from pcflow.naming import (
    STAMPED_TAGS,
    TAG_EXPIRES,
    TAG_RUN,
    TAG_STACK,
    Component,
    dag_run_of,
    digest,
    parse_expires,
    resource_name,
    run_key_from_context,
    standard_tags,
)

if TYPE_CHECKING:  # a pydantic model: built when a network task runs, not when a DAG file is parsed
    from pcflow.aws.network_spec import NetworkSpec

log = logging.getLogger(__name__)


class NetworkMismatch(ResourceConflict):
    """A resource with this stack's identity exists but differs from the spec: pcflow will not change it."""


def _refused(name: str, problem: str) -> PcflowInputError:
    """A refused `network.<name>` setting, in errors.refusal's words (a stage's check: the profile's
    `overridable` is not at hand)."""
    return refused(f"network.{name}", problem, profile_setting())


@dataclass(frozen=True)
class NetworkIds:
    """The stage's output (XCom): everything the cluster config needs."""

    vpc_id: str
    head_subnet_id: str
    compute_subnet_ids: tuple[str, ...]
    head_security_group_id: str
    cluster_security_group_id: str
    availability_zone: str
    adopted: bool = False
    internet_gateway_id: str | None = None
    route_table_ids: tuple[str, ...] = ()
    s3_endpoint_id: str | None = None
    nat_gateway_id: str | None = None
    private_subnet_ids: tuple[str, ...] = field(default=())
    #: The compute subnet of each other zone (`NetworkSpec.zone_subnet_cidrs`): zone -> subnet id.
    zone_subnet_ids: Mapping[str, str] = field(default_factory=dict)
    #: Whether this call created the VPC (a network made, not adopted): what a rehearsal counts. Not part of
    #: the network's identity (two ensures of one network compare equal).
    created: bool = field(default=False, compare=False)

    def to_xcom(self) -> dict[str, Any]:
        """The ids as JSON (tuples as lists), for the cluster stage and the run's record."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    def __hash__(self) -> int:  # frozen, but zone_subnet_ids is a dict: hash what identifies the network
        return hash((self.vpc_id, self.head_subnet_id, self.compute_subnet_ids))


def choose_availability_zone(ec2: Any, region: str, wanted: str | None) -> str:
    """The zone a new network's subnets go to: the one asked for, else the region's first available one
    (the account preflight asks what this zone offers before the network exists)."""
    zones = ec2.describe_availability_zones(Filters=[{"Name": "state", "Values": ["available"]}])
    names = sorted(z["ZoneName"] for z in zones["AvailabilityZones"])
    if wanted is None:
        return names[0]
    if wanted not in names:
        raise _refused("availability_zone", f"{wanted!r} is not available in {region}; choose one of {names}")
    return wanted


class _Ensurer:
    """One ensure run: the spec, the tags and a client; each step looks up by Name tag, then creates."""

    def __init__(self, ec2: Any, spec: NetworkSpec, tags: Mapping[str, str], waiter_delay: int):
        self.ec2 = ec2
        self.spec = spec
        self.tags = dict(tags)
        self.waiter_delay = waiter_delay
        # A run's own network is that run's alone: its key is part of every name and lookup, so a
        # run never adopts the stack's shared network (nor another run's) and then deletes it.
        self.run = self.tags.get(TAG_RUN)
        self.nat_allocation_id: str | None = None
        self.vpc_tags: dict[str, str] = {}  # the tags only the VPC carries (where its references are)
        self.found_vpc_tags: dict[str, str] | None = None  # None: this call created the VPC

    def name(self, role: str) -> str:
        return resource_name(self.spec.stack, Component.NETWORK, role, *([self.run] if self.run else []))

    def tags_for(self, role: str) -> dict[str, str]:
        return {**self.tags, "Name": self.name(role)}

    def identity(self, role: str) -> list[dict[str, Any]]:
        return [tag_equals(TAG_STACK, self.spec.stack), tag_equals("Name", self.name(role))]

    def token(self, role: str) -> str:
        """Deterministic ClientToken: the same on every Airflow retry, unlike botocore's uuid4."""
        return f"pcflow-{digest(self.spec.stack, 'network', role, self.run, length=40)}"

    # --- steps ---

    def availability_zone(self) -> str:
        """The network's zone; the other zones it makes compute subnets in are checked here too, before
        anything is made: each one the region has, none the network's own (its subnets are there)."""
        zone = choose_availability_zone(self.ec2, self.spec.region, self.spec.availability_zone)
        for other in self.spec.zone_subnet_cidrs:
            if other == zone:
                raise _refused("zone_subnet_cidrs", f"{zone} is the network's own zone (its subnets are there)")
            choose_availability_zone(self.ec2, self.spec.region, other)
        return zone

    def vpc(self) -> str:
        found = find_one(self.ec2.describe_vpcs, "Vpcs", what="VPC", id_key="VpcId", Filters=self.identity("vpc"))
        if found:
            if found["CidrBlock"] != self.spec.vpc_cidr:
                raise NetworkMismatch(
                    f"VPC {found['VpcId']} of stack {self.spec.stack} has CIDR {found['CidrBlock']}, the spec asks "
                    f"for {self.spec.vpc_cidr}; tear the stack's network down first or use another stack name"
                )
            vpc_id = found["VpcId"]
            self.found_vpc_tags = tag_dict(found.get("Tags"))
            log.info("adopting VPC %s (%s)", vpc_id, found["CidrBlock"])
        else:
            tags = {**self.tags_for("vpc"), **self.vpc_tags}
            vpc_id = self.ec2.create_vpc(
                CidrBlock=self.spec.vpc_cidr, TagSpecifications=tag_specifications("vpc", tags)
            )["Vpc"]["VpcId"]
            log.info("created VPC %s (%s)", vpc_id, self.spec.vpc_cidr)
        self.wait("vpc_available", {"VpcIds": [vpc_id]}, f"VPC {vpc_id}", "Vpcs[0].State")
        # ParallelCluster needs DNS hostnames; each attribute must be set in its own call.
        self.ec2.modify_vpc_attribute(VpcId=vpc_id, EnableDnsSupport={"Value": True})
        self.ec2.modify_vpc_attribute(VpcId=vpc_id, EnableDnsHostnames={"Value": True})
        return vpc_id

    def internet_gateway(self, vpc_id: str) -> str:
        found = find_one(
            self.ec2.describe_internet_gateways,
            "InternetGateways",
            what="internet gateway",
            id_key="InternetGatewayId",
            Filters=self.identity("igw"),
        )
        if found:
            igw_id = found["InternetGatewayId"]
            attached = [a["VpcId"] for a in found.get("Attachments", [])]
        else:
            igw_id = self.ec2.create_internet_gateway(
                TagSpecifications=tag_specifications("internet-gateway", self.tags_for("igw"))
            )["InternetGateway"]["InternetGatewayId"]
            attached = []
            log.info("created internet gateway %s", igw_id)
        if attached and attached != [vpc_id]:
            raise NetworkMismatch(f"internet gateway {igw_id} is attached to {attached}, not to {vpc_id}")
        if not attached:
            self.ec2.attach_internet_gateway(InternetGatewayId=igw_id, VpcId=vpc_id)
        return igw_id

    def subnet(self, vpc_id: str, role: str, cidr: str, zone: str, *, public: bool) -> str:
        found = find_one(
            self.ec2.describe_subnets, "Subnets", what="subnet", id_key="SubnetId", Filters=self.identity(role)
        )
        if found:
            if found["CidrBlock"] != cidr or found["VpcId"] != vpc_id:
                raise NetworkMismatch(
                    f"subnet {found['SubnetId']} ({role}) is {found['CidrBlock']} in {found['VpcId']}, the spec asks "
                    f"for {cidr} in {vpc_id}; tear the stack's network down first"
                )
            subnet_id = found["SubnetId"]
        else:
            subnet_id = self.ec2.create_subnet(
                VpcId=vpc_id,
                CidrBlock=cidr,
                AvailabilityZone=zone,
                TagSpecifications=tag_specifications("subnet", self.tags_for(role)),
            )["Subnet"]["SubnetId"]
            log.info("created subnet %s (%s, %s)", subnet_id, role, cidr)
        if public:
            self.ec2.modify_subnet_attribute(SubnetId=subnet_id, MapPublicIpOnLaunch={"Value": True})
        return subnet_id

    def routed_subnets(self, vpc_id: str, igw_id: str, zone: str) -> tuple[str, list[str], dict[str, str], Any, list]:
        """The subnets and their route tables: the public one (the head node's; compute's too without a NAT
        gateway), the private ones behind the NAT gateway, and the other zones' compute subnets, routed as
        compute's own. Returns (public id, private ids, {zone: id}, NAT gateway id or None, route table ids)."""
        spec = self.spec
        public_id = self.subnet(vpc_id, "public", spec.public_subnet_cidr, zone, public=True)
        zone_ids = self.zone_subnets(vpc_id)
        public_rt = [public_id, *([] if spec.nat_gateway else zone_ids.values())]
        route_tables = [self.route_table(vpc_id, "public-rt", public_rt, {"GatewayId": igw_id})]
        if not spec.nat_gateway:
            return public_id, [], zone_ids, None, route_tables
        private_ids = [
            self.subnet(vpc_id, f"private-{i + 1}", cidr, zone, public=False)
            for i, cidr in enumerate(spec.private_subnet_cidrs)
        ]
        nat_id = self.nat_gateway(public_id)
        compute = [*private_ids, *zone_ids.values()]
        route_tables.append(self.route_table(vpc_id, "private-rt", compute, {"NatGatewayId": nat_id}))
        return public_id, private_ids, zone_ids, nat_id, route_tables

    def zone_subnets(self, vpc_id: str) -> dict[str, str]:
        """The compute subnet of each other zone the spec lists (zone -> id), found by its Name tag or made:
        public without a NAT gateway (compute's subnet is then the public one), private behind it otherwise."""
        public = not self.spec.nat_gateway
        return {
            zone: self.subnet(vpc_id, f"zone-{zone}", cidr, zone, public=public)
            for zone, cidr in self.spec.zone_subnet_cidrs.items()
        }

    def route_table(self, vpc_id: str, role: str, subnet_ids: Sequence[str], default_route: Mapping[str, str]) -> str:
        found = find_one(
            self.ec2.describe_route_tables,
            "RouteTables",
            what="route table",
            id_key="RouteTableId",
            Filters=self.identity(role),
        )
        if found is None:
            found = self.ec2.create_route_table(
                VpcId=vpc_id,
                ClientToken=self.token(role),
                TagSpecifications=tag_specifications("route-table", self.tags_for(role)),
            )["RouteTable"]
            log.info("created route table %s (%s)", found["RouteTableId"], role)
        rt_id = found["RouteTableId"]
        current = next((r for r in found.get("Routes", []) if r.get("DestinationCidrBlock") == "0.0.0.0/0"), None)
        ((target_key, target_id),) = default_route.items()
        if current is None:
            self.ec2.create_route(RouteTableId=rt_id, DestinationCidrBlock="0.0.0.0/0", **{target_key: target_id})
        elif current.get(target_key) != target_id:
            self.ec2.replace_route(RouteTableId=rt_id, DestinationCidrBlock="0.0.0.0/0", **{target_key: target_id})
        associated = {a.get("SubnetId") for a in found.get("Associations", [])}
        for subnet_id in subnet_ids:
            if subnet_id not in associated:
                self.ec2.associate_route_table(RouteTableId=rt_id, SubnetId=subnet_id)
        return rt_id

    def nat_address(self) -> str:
        """The NAT gateway's elastic IP: found by its identity, or allocated."""
        addr = self.ec2.describe_addresses(Filters=self.identity("nat-eip")).get("Addresses", [])
        if len(addr) > 1:
            raise NetworkMismatch(f"{len(addr)} elastic IPs carry the NAT identity of stack {self.spec.stack}")
        if addr:
            return addr[0]["AllocationId"]
        tags = tag_specifications("elastic-ip", self.tags_for("nat-eip"))
        return self.ec2.allocate_address(Domain="vpc", TagSpecifications=tags)["AllocationId"]

    def nat_gateway(self, public_subnet_id: str) -> str:
        self.nat_allocation_id = self.nat_address()
        filters = [*self.identity("nat"), {"Name": "state", "Values": ["pending", "available"]}]
        found = find_one(
            self.ec2.describe_nat_gateways, "NatGateways", what="NAT gateway", id_key="NatGatewayId", Filter=filters
        )
        if found:
            nat_id = found["NatGatewayId"]
        else:
            nat_id = self.ec2.create_nat_gateway(
                SubnetId=public_subnet_id,
                AllocationId=self.nat_allocation_id,
                ClientToken=self.token("nat"),
                TagSpecifications=tag_specifications("natgateway", self.tags_for("nat")),
            )["NatGateway"]["NatGatewayId"]
        self.wait("nat_gateway_available", {"NatGatewayIds": [nat_id]}, f"NAT gateway {nat_id}", "NatGateways[0].State")
        return nat_id

    def wait(self, waiter: str, args: Mapping[str, Any], what: str, status: str) -> None:
        """Block on an EC2 waiter, the resource's status logged after every attempt."""
        wait_logged(self.ec2.get_waiter(waiter), args, what=what, status_args=[status], delay=self.waiter_delay)

    def s3_endpoint(self, vpc_id: str, route_table_ids: Sequence[str]) -> str:
        filters = [*self.identity("s3-endpoint"), {"Name": "vpc-endpoint-state", "Values": ["pending", "available"]}]
        found = find_one(
            self.ec2.describe_vpc_endpoints,
            "VpcEndpoints",
            what="VPC endpoint",
            id_key="VpcEndpointId",
            Filters=filters,
        )
        if found is None:
            return self.ec2.create_vpc_endpoint(
                VpcId=vpc_id,
                ServiceName=f"com.amazonaws.{self.spec.region}.s3",
                VpcEndpointType="Gateway",
                RouteTableIds=list(route_table_ids),
                ClientToken=self.token("s3-endpoint"),
                TagSpecifications=tag_specifications("vpc-endpoint", self.tags_for("s3-endpoint")),
            )["VpcEndpoint"]["VpcEndpointId"]
        missing = sorted(set(route_table_ids) - set(found.get("RouteTableIds", [])))
        if missing:
            self.ec2.modify_vpc_endpoint(VpcEndpointId=found["VpcEndpointId"], AddRouteTableIds=missing)
        return found["VpcEndpointId"]

    def security_group(self, vpc_id: str, role: str, description: str) -> str:
        from botocore.exceptions import ClientError

        filters = [*self.identity(role), {"Name": "vpc-id", "Values": [vpc_id]}]
        found = find_one(
            self.ec2.describe_security_groups,
            "SecurityGroups",
            what="security group",
            id_key="GroupId",
            Filters=filters,
        )
        if found:
            return found["GroupId"]
        try:
            return self.ec2.create_security_group(
                GroupName=self.name(role),
                Description=description,
                VpcId=vpc_id,
                TagSpecifications=tag_specifications("security-group", self.tags_for(role)),
            )["GroupId"]
        except ClientError as error:
            if error_code(error) == "InvalidGroup.Duplicate":
                raise NetworkMismatch(
                    f"a security group named {self.name(role)} exists in {vpc_id} without pcflow's tags for stack "
                    f"{self.spec.stack}; delete or rename it"
                ) from error
            raise

    def cluster_rules(self, group_id: str) -> None:
        """All traffic between members of the cluster group (MPI, NCCL, Slurm, NFS, Lustre)."""
        sg = self.ec2.describe_security_groups(GroupIds=[group_id])["SecurityGroups"][0]
        for perm in sg.get("IpPermissions", []):
            if perm.get("IpProtocol") == "-1" and any(
                p["GroupId"] == group_id for p in perm.get("UserIdGroupPairs", [])
            ):
                return
        self.ec2.authorize_security_group_ingress(
            GroupId=group_id, IpPermissions=[{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group_id}]}]
        )

    def ssh_rules(self, group_id: str) -> None:
        """SSH from exactly the configured CIDRs: missing ones added, ones no longer configured revoked."""
        sg = self.ec2.describe_security_groups(GroupIds=[group_id])["SecurityGroups"][0]
        have_v4: set[str] = set()
        have_v6: set[str] = set()
        for perm in sg.get("IpPermissions", []):
            if perm.get("IpProtocol") == "tcp" and perm.get("FromPort") == 22 and perm.get("ToPort") == 22:
                have_v4 |= {r["CidrIp"] for r in perm.get("IpRanges", [])}
                have_v6 |= {r["CidrIpv6"] for r in perm.get("Ipv6Ranges", [])}
        want = [ipaddress.ip_network(c) for c in self.spec.ssh_ingress_cidrs]
        want_v4 = {str(c) for c in want if c.version == 4}
        want_v6 = {str(c) for c in want if c.version == 6}

        def perm(v4: set[str], v6: set[str]) -> list[dict[str, Any]]:
            item: dict[str, Any] = {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22}
            if v4:
                item["IpRanges"] = [{"CidrIp": c, "Description": "pcflow ssh"} for c in sorted(v4)]
            if v6:
                item["Ipv6Ranges"] = [{"CidrIpv6": c, "Description": "pcflow ssh"} for c in sorted(v6)]
            return [item]

        if want_v4 - have_v4 or want_v6 - have_v6:
            self.ec2.authorize_security_group_ingress(
                GroupId=group_id, IpPermissions=perm(want_v4 - have_v4, want_v6 - have_v6)
            )
        if have_v4 - want_v4 or have_v6 - want_v6:
            self.ec2.revoke_security_group_ingress(
                GroupId=group_id, IpPermissions=perm(have_v4 - want_v4, have_v6 - want_v6)
            )


def ensure_network(
    ec2: Any,
    spec: NetworkSpec,
    *,
    run: str | None = None,
    ttl: dt.timedelta | None = None,
    dag_run: tuple[str, str] | None = None,
    waiter_delay: int = 15,
    references_bucket: str | None = None,
) -> NetworkIds:
    """Create what is missing, adopt what exists and matches, refuse what exists and differs.

    `run` tags the network as one run's (deleted by that run's teardown / the janitor); leave it None
    for a network shared across runs of the stack. Safe to call any number of times. Every call stamps
    the network's `pcflow:expires` again (now + `ttl`): a kept network lives `ttl` past its last run,
    and names that run (`dag_run`, as (dag_id, run_id)), which the janitor asks Airflow about; a shared
    network's expiry only moves later (a short run after a nightly does not shorten what the nightly keeps).
    `references_bucket`: where the runs using a shared network hold their references (pcflow.aws.network_users),
    named in the VPC's `pcflow:references` tag.
    """
    tags = standard_tags(stack=spec.stack, component=Component.NETWORK, run=run, ttl=ttl, dag_run=dag_run)
    step = _Ensurer(ec2, spec, tags, waiter_delay)
    if references_bucket:
        step.vpc_tags = {TAG_REFERENCES: references_bucket}
    if spec.adopted:
        return _adopt(step, spec)
    zone = step.availability_zone()
    vpc_id = step.vpc()
    if run is None and not _postpones(step.found_vpc_tags, tags):
        tags = {**tags, **{key: step.found_vpc_tags[key] for key in STAMPED_TAGS if key in step.found_vpc_tags}}
    igw_id = step.internet_gateway(vpc_id)
    public_id, private_ids, zone_ids, nat_id, route_tables = step.routed_subnets(vpc_id, igw_id, zone)
    endpoint_id = step.s3_endpoint(vpc_id, route_tables) if spec.s3_endpoint else None
    cluster_sg = step.security_group(vpc_id, "cluster-sg", "pcflow: all traffic between cluster nodes")
    step.cluster_rules(cluster_sg)
    head_sg = step.security_group(vpc_id, "head-sg", "pcflow: SSH to the head node from configured CIDRs")
    step.ssh_rules(head_sg)
    owned = [vpc_id, igw_id, public_id, *private_ids, *zone_ids.values(), *route_tables, endpoint_id, nat_id]
    owned += [step.nat_allocation_id]
    refresh_expiry(ec2, [*owned, cluster_sg, head_sg], tags)
    return NetworkIds(
        created=step.found_vpc_tags is None,
        vpc_id=vpc_id,
        head_subnet_id=public_id,
        # Without NAT, compute shares the public subnet; it has no public ingress (cluster SG only).
        compute_subnet_ids=tuple(private_ids) or (public_id,),
        head_security_group_id=head_sg,
        cluster_security_group_id=cluster_sg,
        availability_zone=zone,
        internet_gateway_id=igw_id,
        route_table_ids=tuple(route_tables),
        s3_endpoint_id=endpoint_id,
        nat_gateway_id=nat_id,
        private_subnet_ids=tuple(private_ids),
        zone_subnet_ids=zone_ids,
    )


def _postpones(found: Mapping[str, str] | None, tags: Mapping[str, str]) -> bool:
    """Whether stamping `tags` on a found VPC moves its expiry later (or it has none to keep: created now)."""
    if found is None:
        return True
    try:
        current, wanted = parse_expires(found.get(TAG_EXPIRES)), parse_expires(tags.get(TAG_EXPIRES))
    except ValueError:
        return True
    if current is None:  # `never` (or no tag) stays: nothing shorter replaces it
        return TAG_EXPIRES not in found
    return wanted is None or wanted >= current


def _adopt(step: _Ensurer, spec: NetworkSpec) -> NetworkIds:
    """Use the caller's VPC and subnets as they are; only pcflow's tagged security groups are added."""
    from botocore.exceptions import ClientError

    ec2 = step.ec2
    try:
        ec2.describe_vpcs(VpcIds=[spec.vpc_id])
    except ClientError as error:
        if error_code(error).endswith("NotFound"):
            raise _refused(
                "vpc_id", f"{spec.vpc_id} does not exist in {spec.region}; check the id and region"
            ) from None
        raise
    subnet_ids = [spec.public_subnet_id, *spec.private_subnet_ids]
    try:
        subnets = ec2.describe_subnets(SubnetIds=subnet_ids)["Subnets"]
    except ClientError as error:
        if error_code(error).endswith("NotFound"):
            raise _refused("public_subnet_id", f"subnet(s) {subnet_ids} not found in {spec.region}: {error}") from None
        raise
    outside = [s["SubnetId"] for s in subnets if s["VpcId"] != spec.vpc_id]
    if outside:
        raise _refused("private_subnet_ids", f"subnet(s) {outside} are not in vpc {spec.vpc_id}")
    zone = next(s["AvailabilityZone"] for s in subnets if s["SubnetId"] == spec.public_subnet_id)
    cluster_sg = step.security_group(spec.vpc_id, "cluster-sg", "pcflow: all traffic between cluster nodes")
    step.cluster_rules(cluster_sg)
    head_sg = step.security_group(spec.vpc_id, "head-sg", "pcflow: SSH to the head node from configured CIDRs")
    step.ssh_rules(head_sg)
    refresh_expiry(ec2, [cluster_sg, head_sg], step.tags)  # the VPC and subnets are not pcflow's
    return NetworkIds(
        vpc_id=spec.vpc_id,
        head_subnet_id=spec.public_subnet_id,
        compute_subnet_ids=tuple(spec.private_subnet_ids) or (spec.public_subnet_id,),
        head_security_group_id=head_sg,
        cluster_security_group_id=cluster_sg,
        availability_zone=zone,
        adopted=True,
        private_subnet_ids=tuple(spec.private_subnet_ids),
    )


#: What the network-only teardown selects: resources tagged `pcflow:component=network`.
NETWORK_COMPONENTS = frozenset({str(Component.NETWORK)})


def delete_network(clients: Any, *, stack: str, run: str | None = None, dry_run: bool = False, **loop_options: Any):
    """The network's convergent teardown: everything tagged `pcflow:component=network` for the stack (or run).

    Instances in the VPC (also tagged by their own stage) must be selected to go first, so the whole stack
    is usually torn down together with `teardown`; this is the network-only shortcut."""
    selector = Selector(stack=stack, run=run, components=NETWORK_COMPONENTS)
    return teardown(clients, selector, handler_sets=DEFAULT_HANDLER_SETS, dry_run=dry_run, **loop_options)


# --- the stack's network, shared by its runs (pcflow.aws.network_users) ----------------------------


def use_network(
    ec2: Any,
    s3: Any,
    spec: NetworkSpec,
    *,
    bucket: str,
    run: str,
    ttl: dt.timedelta | None = None,
    dag_run: tuple[str, str] | None = None,
    waiter_delay: int = 15,
    lock_delay: float = 5.0,
) -> NetworkIds:
    """The stack's shared network for `run`: its reference first, then (under the stack's network lock)
    the network found or created. A release deciding meanwhile either sees the reference or has deleted
    the network before this looks: the network returned exists."""
    take_reference(s3, bucket, spec.stack, run, dag_run)
    with network_lock(s3, bucket, spec.stack, holder=run, delay=lock_delay):
        return ensure_network(ec2, spec, ttl=ttl, dag_run=dag_run, waiter_delay=waiter_delay, references_bucket=bucket)


def release_network(
    clients: Any, *, stack: str, bucket: str, run: str, dry_run: bool = False, lock_delay: float = 5.0, **loop: Any
) -> dict[str, Any]:
    """`run` stops using the stack's network; the network is deleted when it was the last user and nothing
    kept (an instance: the nightly's cluster) is in the VPC. Returns what was decided (`network_deleted`: this
    call deleted it), and the teardown's report when it went on to delete. Waits for the network lock in
    this process (`ReleaseNetworkOperator` defers instead)."""
    s3 = clients("s3")
    if (kept := drop_and_look(s3, bucket=bucket, stack=stack, run=run, dry_run=dry_run)) is not None:
        return kept
    with network_lock(s3, bucket, stack, holder=run, delay=lock_delay):
        return delete_if_last(clients, stack=stack, bucket=bucket, run=run, dry_run=dry_run, **loop)


def drop_and_look(s3: Any, *, bucket: str, stack: str, run: str, dry_run: bool) -> dict[str, Any] | None:
    """`run`'s reference given back (not in a dry run); what the release decided when other runs still use
    the network, else None: the last user goes on to `delete_if_last`, under the network lock."""
    if not dry_run:
        drop_reference(s3, bucket, stack, run)
    return kept_for_others(s3, bucket=bucket, stack=stack, run=run)


def kept_for_others(s3: Any, *, bucket: str, stack: str, run: str) -> dict[str, Any] | None:
    """The release's decision when runs other than `run` hold a reference; None when there are none."""
    others = [ref.run for ref in references(s3, bucket, stack) if ref.run != run]
    if not others:
        return None
    log.info("network of stack %s kept: used by run(s) %s", stack, ", ".join(others))
    return {"network_deleted": False, "kept": f"used by {len(others)} other run(s)", "users": others}


def delete_if_last(clients: Any, *, stack: str, bucket: str, run: str, dry_run: bool, **loop: Any) -> dict[str, Any]:
    """Under the stack's network lock: the references looked at again (a run may have taken one since), then
    the network deleted unless an instance is in its VPC."""
    ec2 = clients("ec2")
    if (kept := kept_for_others(clients("s3"), bucket=bucket, stack=stack, run=run)) is not None:
        return kept
    vpc = find_one(
        ec2.describe_vpcs,
        "Vpcs",
        what="VPC",
        id_key="VpcId",
        Filters=[tag_equals(TAG_STACK, stack), tag_equals("Name", resource_name(stack, Component.NETWORK, "vpc"))],
    )
    instances = vpc_in_use(ec2, vpc["VpcId"]) if vpc else []
    if instances:
        log.info("network of stack %s kept: instances %s are in its VPC", stack, ", ".join(instances))
        return {"network_deleted": False, "kept": f"{len(instances)} instance(s) in the VPC", "instances": instances}
    report = delete_network(clients, stack=stack, dry_run=dry_run, **loop)
    # Whether this release deleted it: False when another's release had (both saw no user, one after the other).
    return {**report.to_xcom(), "network_deleted": bool(report.deleted), "users": []}


# --- operators ----------------------------------------------------------------------------------


class EnsureNetworkOperator(PcflowAwsOperator):
    """Ensure the stack's network; returns `NetworkIds.to_xcom()`.

    :param stack: the stack name (shared resources are named and tagged with it).
    :param network: the network section of the spec (`NetworkSpec` fields, e.g. `ssh_ingress_cidrs`).
    :param run_scoped: tag the network with this run's key, so the run's teardown deletes it.
    :param ttl_hours: `pcflow:expires` for the janitor, stamped again by every run; None = never.
    :param references_bucket: the stack's network shared by its runs (`use_network`): this run takes a
        reference, kept in this bucket, which its `ReleaseNetworkOperator` gives back.
    :param deferrable: while another run holds the stack's network lock, wait in the triggerer
        (`LockReleasedTrigger`) instead of in this worker slot; default: Airflow's
        `operators.default_deferrable` (pcflow's deployments set it).
    """

    template_fields: Sequence[str] = aws_template_fields("stack", "network", "ttl_hours", "references_bucket")
    template_fields_renderers: ClassVar[dict[str, str]] = {"network": "json"}
    ui_color = "#c6e2ff"

    def __init__(
        self,
        *,
        stack: str,
        network: Mapping[str, Any] | None = None,
        run_scoped: bool = False,
        ttl_hours: float | None = None,
        waiter_delay: int = 15,
        references_bucket: str | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.stack = stack
        self.network = network
        self.run_scoped = run_scoped
        self.ttl_hours = ttl_hours
        self.waiter_delay = waiter_delay
        self.references_bucket = references_bucket
        self.deferrable = deferrable

    def execute(self, context: Any) -> dict[str, Any]:
        from pcflow.aws.network_spec import NetworkSpec

        spec = NetworkSpec.of(self.stack, self.hook.region_name, self.network)
        ttl = dt.timedelta(hours=self.ttl_hours) if self.ttl_hours is not None else None
        timing = {"ttl": ttl, "dag_run": dag_run_of(context), "waiter_delay": self.waiter_delay}
        if self.references_bucket and self.deferrable:
            ids = self.use_shared(context, spec, timing)
        elif self.references_bucket:
            s3, run = self.client("s3"), run_key_from_context(context)
            ids = use_network(self.ec2, s3, spec, bucket=self.references_bucket, run=run, **timing)
        else:
            run = run_key_from_context(context) if self.run_scoped else None
            ids = ensure_network(self.ec2, spec, run=run, **timing)
        self.log.info("network of stack %s: vpc %s, head subnet %s", self.stack, ids.vpc_id, ids.head_subnet_id)
        return ids.to_xcom()

    def use_shared(self, context: Any, spec: NetworkSpec, timing: dict[str, Any]) -> NetworkIds:
        """`use_network`, deferred while another run holds the stack's network lock (creating the network, or
        deleting it as its last user): the reference first, then the network under the lock."""
        s3, run, bucket = self.client("s3"), run_key_from_context(context), self.references_bucket
        take_reference(s3, bucket, spec.stack, run, timing["dag_run"])
        lock = lock_of(s3, bucket, spec.stack, run)
        found = lock.try_acquire()
        if found is not None:
            self.defer_on_lock(lock, found, method_name="lock_released", waiter_delay=self.waiter_delay)
        with lock.releasing():
            return ensure_network(self.ec2, spec, references_bucket=bucket, **timing)

    def lock_released(self, context: Any, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """Back from the lock's wait (released, changed hands, or the wait's bound reached): try again."""
        self.log.info("network lock: %s", (event or {}).get("status"))
        return self.execute(context)


class DeleteNetworkOperator(TeardownOperator):
    """Convergent teardown of the stack's network (adopted VPCs and subnets are untagged, so kept): the
    teardown operator narrowed to the network component, and to this run's network when `run_scoped`."""

    def __init__(self, *, run_scoped: bool = False, **kwargs: Any):
        super().__init__(components=sorted(NETWORK_COMPONENTS), **kwargs)
        self.run_scoped = run_scoped

    def selector(self, context: Any) -> Selector:
        selector = super().selector(context)
        return replace(selector, run=run_key_from_context(context)) if self.run_scoped else selector


class ReleaseNetworkOperator(DeleteNetworkOperator):
    """The run's reference to the stack's shared network given back (`release_network`): the network is
    deleted only by its last user, and not while an instance (a kept cluster) is in it. Wire it as a
    teardown of the network task, after the run's own resources are gone.

    :param references_bucket: the bucket keeping the stack's network references and lock.
    :param deferrable: while another run holds the stack's network lock (creating the network, or deleting
        it as its last user), the last user waits in the triggerer (`LockReleasedTrigger`), as the network
        task does, instead of in this worker slot.
    """

    template_fields: Sequence[str] = (*DeleteNetworkOperator.template_fields, "references_bucket")

    def __init__(
        self,
        *,
        references_bucket: str,
        waiter_delay: int = 15,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.references_bucket = references_bucket
        self.waiter_delay = waiter_delay
        self.deferrable = deferrable

    def execute(self, context: Any) -> dict[str, Any]:
        stack, run, dry_run = self.selector(context).stack, run_key_from_context(context), self.is_dry_run(context)
        release = {"stack": stack, "bucket": self.references_bucket, "run": run, "dry_run": dry_run}
        loop = {"pass_delay": self.pass_delay, "max_passes": self.max_passes, "logger": self.log}
        if not self.deferrable:
            return release_network(self.client, **release, **loop)
        if (kept := drop_and_look(self.client("s3"), **release)) is not None:
            return kept
        lock = lock_of(self.client("s3"), self.references_bucket, stack, run)
        if (found := lock.try_acquire()) is not None:
            self.defer_on_lock(lock, found, method_name="lock_released", waiter_delay=self.waiter_delay)
        with lock.releasing():
            return delete_if_last(self.client, **release, **loop)

    def lock_released(self, context: Any, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """Back from the lock's wait (released, changed hands, or the wait's bound reached): the release again
        (giving back a reference already given back is a no-op)."""
        self.log.info("network lock: %s", (event or {}).get("status"))
        return self.execute(context)
