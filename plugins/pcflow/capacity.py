"""Capacity-aware launch: the ways a run may get its nodes, in the profile's order, and when to take the next.

A run's nodes come from its `instance_type` and `capacity_type`, and, where the profile says so, from more
instance types of the same compute resource (ParallelCluster's flexible instance types, `Instances`, picked by
its `AllocationStrategy`) and from fallback options tried in order (another type, on-demand after spot, a
capacity reservation, another availability zone). Each option is one Slurm partition: on ParallelCluster one
queue pcflow renders (`<queue_name>`, `<queue_name>-2`, ...), on a static cluster one the admin made (the option
names it). An option that names an `availability_zone` launches in that zone's compute subnet, which the stack's
network makes for each zone the profile lists in `network.zone_subnet_cidrs` (pcflow.aws.network): EC2 reports
capacity per type and zone, so a type short in the network's own zone may be there in another.

ParallelCluster (3.2+, "fast insufficient capacity fail-over") reports an EC2 capacity error on the Slurm
nodes: slurm_resume sets the nodes it could not launch DOWN with the reason `(Code:<error>)Failure when
resuming nodes`, clustermgtd the compute resource's others `(Code:<error>)Temporarily disabling node due
to insufficient capacity` for `insufficient_capacity_timeout` (600 s), and the job stays PENDING. The train
wait (pcflow.slurm.trigger) then moves the pending job to the next option's partition (`decide`, then
`scontrol update JobId=... Partition=...`), says so in the task log with the option's price, and records it.
The cost estimate prices the dearest option (pcflow.budget), so a fallback never runs above the estimate.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pcflow.patterns import AVAILABILITY_ZONE, INSTANCE_TYPE, PARTITION

#: The EC2 errors ParallelCluster's fast fail-over treats as insufficient capacity (its user guide,
#: "Slurm cluster fast insufficient capacity fail-over").
INSUFFICIENT_CAPACITY_CODES = (
    "InsufficientInstanceCapacity",
    "InsufficientHostCapacity",
    "InsufficientReservedInstanceCapacity",
    "MaxSpotInstanceCountExceeded",
    "SpotMaxPriceTooLow",
    "Unsupported",
)
#: The code in a Slurm node's reason, as slurm_resume and clustermgtd write it: `(Code:<error>)...`.
REASON_CODE = re.compile(r"\(Code:([A-Za-z]+)\)")
#: `sinfo` for one partition, one line per node: name|state (long)|reason.
SINFO_NODES = ["sinfo", "-h", "-N", "-o", "%N|%T|%E", "-p"]
#: On-demand capacity takes only these allocation strategies, spot every other (ParallelCluster's
#: InstancesAllocationStrategyValidator).
ONDEMAND_STRATEGIES = ("lowest-price", "prioritized")
AllocationStrategy = Literal[
    "lowest-price", "capacity-optimized", "price-capacity-optimized", "prioritized", "capacity-optimized-prioritized"
]


class CapacityOption(BaseModel):
    """One more way to get the run's nodes, tried when the options before it had no capacity."""

    model_config = ConfigDict(extra="forbid")

    instance_types: list[str] = Field(min_length=1, description="the types one compute resource may launch")
    capacity_type: Literal["spot", "ondemand"]
    allocation_strategy: AllocationStrategy | None = None
    capacity_reservation_id: str | None = Field(None, pattern=r"^cr-[0-9a-f]{8,17}$")
    partition: str | None = Field(
        None,
        description="static clusters: the Slurm partition of these nodes (ParallelCluster: pcflow names its queue)",
    )
    availability_zone: str | None = Field(
        None,
        description="ParallelCluster: launch in this zone's subnet (one of network.zone_subnet_cidrs); "
        "None: the network's own zone",
    )

    @field_validator("instance_types")
    @classmethod
    def _types(cls, value: list[str]) -> list[str]:
        bad = [t for t in value if not INSTANCE_TYPE.fullmatch(t)]
        if bad or len(set(value)) != len(value):
            raise ValueError(f"{bad or value}: EC2 instance types, each once (such as g5.12xlarge)")
        return value

    @field_validator("partition")
    @classmethod
    def _partition(cls, value: str | None) -> str | None:
        if value is not None and not PARTITION.fullmatch(value):
            raise ValueError(f"{value!r} is not a Slurm partition name")
        return value

    @field_validator("availability_zone")
    @classmethod
    def _zone(cls, value: str | None) -> str | None:
        if value is not None and not AVAILABILITY_ZONE.fullmatch(value):
            raise ValueError(f"{value!r} is not an availability zone's name (such as us-east-1b)")
        return value

    @model_validator(mode="after")
    def _fits(self) -> CapacityOption:
        check_option(self.capacity_type, self.allocation_strategy, self.capacity_reservation_id)
        return self


def check_option(capacity_type: str, strategy: str | None, reservation: str | None) -> None:
    """What ParallelCluster refuses of a queue, refused here before anything is created: an on-demand
    strategy spot cannot use and the other way round, a capacity reservation for spot capacity."""
    if capacity_type == "ondemand" and strategy not in (None, *ONDEMAND_STRATEGIES):
        raise ValueError(
            f"allocation_strategy {strategy!r}: on-demand capacity takes {' or '.join(ONDEMAND_STRATEGIES)}"
        )
    if capacity_type == "spot" and strategy == "prioritized":
        raise ValueError("allocation_strategy 'prioritized' is on-demand's; spot takes capacity-optimized-prioritized")
    if capacity_type == "spot" and reservation:
        raise ValueError("capacity_reservation_id: a capacity reservation is on-demand capacity, not spot")


def strategy_for(capacity_type: str, strategy: str | None) -> str | None:
    """The run's own queue's allocation strategy for the capacity type the run chose (a trigger user may pick
    on-demand over the profile's spot): a strategy that type cannot take gives way to ParallelCluster's default."""
    if capacity_type.lower() == "ondemand" and strategy not in ONDEMAND_STRATEGIES:
        return None
    if capacity_type.lower() == "spot" and strategy == "prioritized":
        return None
    return strategy


class PlannedOption(CapacityOption):
    """One option of a run's order (the first task's `capacity_order`): its Slurm partition decided and, once
    the first task priced the run (pcflow.budget.plan_cost), its dearest instance type's price per node-hour,
    which the train task's log line for a move to it quotes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    usd_per_node_hour: float | None = None


class CapacitySettings(BaseModel):
    """The run's own compute resource's extra types and strategy, and the fallback options in order."""

    model_config = ConfigDict(extra="forbid")

    instance_types: list[str] = Field(
        default_factory=list, description="more types beside instance_type (ParallelCluster flexible instance types)"
    )
    allocation_strategy: AllocationStrategy | None = None
    capacity_reservation_id: str | None = Field(None, pattern=r"^cr-[0-9a-f]{8,17}$")
    fallback: list[CapacityOption] = Field(
        default_factory=list, description="tried in this order when the nodes before cannot be launched"
    )


def capacity_order(
    capacity: CapacitySettings,
    *,
    instance_type: str,
    capacity_type: str,
    provider: str,
    first_partition: str | None,
    zones: Iterable[str] = (),
) -> list[PlannedOption]:
    """Every option of the run, its own first: partition, instance types, capacity type, strategy and
    reservation. `capacity`, `instance_type`, `capacity_type`: the run's settings of those names; `provider`:
    its cluster's; `zones`: those its network makes compute subnets in (`network.zone_subnet_cidrs`).
    `first_partition`: where the run's job goes (ParallelCluster: its queue, whose fallback queues are
    `<queue>-2`, `<queue>-3`...; a static cluster: the job's partition, None: the default one)."""
    types = [instance_type, *(t for t in capacity.instance_types if t != instance_type)]
    strategy = strategy_for(capacity_type, capacity.allocation_strategy)
    check_option(capacity_type, strategy, capacity.capacity_reservation_id)
    first = CapacityOption(
        instance_types=types,
        capacity_type=capacity_type,
        allocation_strategy=strategy,
        capacity_reservation_id=capacity.capacity_reservation_id,
        partition=first_partition,
    )
    options = [first, *capacity.fallback]
    check_zones(capacity.fallback, provider=provider, zones=zones)
    order = []
    for index, option in enumerate(options):
        partition = option.partition
        if partition is None and index and provider == "parallelcluster":
            partition = f"{first_partition}-{index + 1}"
        if partition is None and index:
            raise ValueError(f"capacity.fallback[{index - 1}].partition: a static cluster's option names its partition")
        order.append(PlannedOption(**{**option.model_dump(), "partition": partition}))
    return order


def check_zones(fallback: Sequence[CapacityOption], *, provider: str, zones: Iterable[str]) -> None:
    """A fallback's zone must be one the profile's network makes a subnet in (`zones`: the keys of
    `network.zone_subnet_cidrs`, the admin's): the subnets a queue launches in are the stack's network's,
    never one a run names. `provider`: the run's cluster's."""
    zones = sorted(zones)
    for index, option in enumerate(fallback):
        if option.availability_zone is None:
            continue
        if provider != "parallelcluster":
            raise ValueError(
                f"capacity.fallback[{index}].availability_zone: a static cluster's partition decides where its "
                "nodes are; name the partition instead"
            )
        if option.availability_zone not in zones:
            raise ValueError(
                f"capacity.fallback[{index}].availability_zone {option.availability_zone!r}: the network makes "
                f"subnets only in its own zone and {zones or 'no other'} (network.zone_subnet_cidrs)"
            )


@dataclass(frozen=True)
class NodeState:
    """One Slurm node of a partition as sinfo shows it."""

    name: str
    state: str
    reason: str

    @property
    def capacity_code(self) -> str | None:
        """The EC2 insufficient-capacity code ParallelCluster put in the node's reason, if any."""
        match = REASON_CODE.search(self.reason)
        return match.group(1) if match and match.group(1) in INSUFFICIENT_CAPACITY_CODES else None


def parse_nodes(output: str) -> list[NodeState]:
    """Lines of `sinfo -h -N -o '%N|%T|%E' -p <partition>`."""
    nodes = []
    for line in output.splitlines():
        parts = line.split("|", 2)
        if len(parts) == 3:
            nodes.append(NodeState(parts[0].strip(), parts[1].strip().lower(), parts[2].strip()))
    return nodes


@dataclass(frozen=True)
class Move:
    """The decision: move the pending job from one option's partition to the next one's, and why."""

    from_partition: str
    to_partition: str
    code: str
    nodes: tuple[str, ...]
    option: Mapping[str, Any]

    def message(self, job_id: str) -> str:
        """What the task log says: what happened, what pcflow did, and what the new option costs."""
        option, price = self.option, self.option.get("usd_per_node_hour")
        cost = f" at ${price:,.2f} per node-hour" if isinstance(price, int | float) else ""
        zone = option.get("availability_zone")
        where = f" in {zone} (that zone's subnet)" if zone else ""
        return (
            f"capacity: Slurm job {job_id} is pending and partition {self.from_partition}'s nodes "
            f"{','.join(self.nodes)} are down for {self.code} (ParallelCluster could not launch them); pcflow "
            f"moves the job to partition {self.to_partition}: {'/'.join(option['instance_types'])} "
            f"{'on-demand' if option['capacity_type'] == 'ondemand' else 'spot'}{where}{cost}, the profile's next "
            "option (the run's cost estimate priced the dearest option)"
        )


def decide(order: Sequence[Mapping[str, Any]], partition: str, nodes: Iterable[NodeState]) -> Move | None:
    """The move a pending job in `partition` should make: when nodes of its partition are down for
    insufficient capacity and an option follows it in the order; None otherwise (the job waits, and
    ParallelCluster retries the type after its insufficient_capacity_timeout)."""
    short = [n for n in nodes if n.capacity_code and ("down" in n.state or "drain" in n.state)]
    names = [o.get("partition") for o in order]
    if not short or partition not in names:
        return None
    index = names.index(partition)
    if index + 1 >= len(order):
        return None
    following = order[index + 1]
    return Move(
        partition, following["partition"], short[0].capacity_code or "", tuple(n.name for n in short), following
    )
