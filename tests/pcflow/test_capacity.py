"""Capacity-aware launch (issue 27.3), the pure parts: when a pending job's partition is short of capacity (the
node reasons ParallelCluster writes) and where it goes next, the options' partitions, and the estimate, which
prices the dearest option so a fallback never runs above it."""

from __future__ import annotations

import pytest
from run_factories import make_planned_run

from pcflow.budget import plan_cost
from pcflow.capacity import CapacitySettings, capacity_order, decide, parse_nodes
from pcflow.runspec import RunSpecError, resolve_run_spec

#: pcflow/prices.json, us-east-1: on-demand per hour.
G5_12XLARGE, G6_12XLARGE = 5.672, 4.6016
ORDER = [
    {"partition": "gpu", "instance_types": ["g6.12xlarge"], "capacity_type": "spot"},
    {"partition": "gpu-2", "instance_types": ["g5.12xlarge"], "capacity_type": "ondemand", "usd_per_node_hour": 5.672},
]
#: `sinfo -h -N -o '%N|%T|%E' -p gpu` as ParallelCluster leaves the nodes: slurm_resume's reason on the node it
#: could not launch, clustermgtd's on the compute resource's others (aws-parallelcluster-node).
SHORT = (
    "gpu-dy-gpu-1|down~|(Code:InsufficientInstanceCapacity)Failure when resuming nodes\n"
    "gpu-dy-gpu-2|down~|(Code:InsufficientInstanceCapacity)Temporarily disabling node due to insufficient capacity\n"
)


def test_a_pending_job_whose_nodes_are_down_for_capacity_moves_to_the_next_option():
    move = decide(ORDER, "gpu", parse_nodes(SHORT))
    assert (move.from_partition, move.to_partition, move.code) == ("gpu", "gpu-2", "InsufficientInstanceCapacity")
    assert move.nodes == ("gpu-dy-gpu-1", "gpu-dy-gpu-2")
    message = move.message("3007")
    assert "moves the job to partition gpu-2: g5.12xlarge on-demand at $5.67 per node-hour" in message
    spot = "gpu-dy-gpu-1|down~|(Code:MaxSpotInstanceCountExceeded)Failure when resuming nodes"
    assert decide(ORDER, "gpu", parse_nodes(spot)).code == "MaxSpotInstanceCountExceeded"


@pytest.mark.parametrize(
    ("partition", "sinfo"),
    [
        ("gpu-2", SHORT),  # the last option: nothing to fall back to, the job waits
        ("gpu", "gpu-dy-gpu-1|idle~|none"),  # powered down, launchable: the job is only waiting its turn
        ("gpu", "gpu-dy-gpu-1|down|Not responding"),  # down for another reason: not a capacity matter
        ("other", SHORT),  # a partition not among the options
    ],
)
def test_no_move_without_a_capacity_error_or_an_option_after_it(partition, sinfo):
    assert decide(ORDER, partition, parse_nodes(sinfo)) is None


def test_options_take_partitions_from_the_provider():
    capacity = CapacitySettings(
        instance_types=["g5.12xlarge"],
        fallback=[{"instance_types": ["g5.12xlarge"], "capacity_type": "ondemand"}],
    )
    run = {"instance_type": "g6.12xlarge", "capacity_type": "spot", "provider": "parallelcluster"}
    order = capacity_order(capacity, **run, first_partition="gpu")
    assert [(o.partition, o.instance_types, o.capacity_type) for o in order] == [
        ("gpu", ["g6.12xlarge", "g5.12xlarge"], "spot"),
        ("gpu-2", ["g5.12xlarge"], "ondemand"),
    ]
    with pytest.raises(ValueError, match=r"capacity.fallback\[0\].partition: a static cluster's option names"):
        capacity_order(capacity, **{**run, "provider": "static"}, first_partition="compute")
    static = capacity_order(CapacitySettings(), **{**run, "provider": "static"}, first_partition=None)
    assert static[0].partition is None
    # A trigger user's on-demand over the profile's spot: the spot strategy gives way to ParallelCluster's default.
    spot_strategy = capacity.model_copy(update={"allocation_strategy": "price-capacity-optimized"})
    ondemand = capacity_order(spot_strategy, **{**run, "capacity_type": "ondemand"}, first_partition="gpu")[0]
    assert ondemand.allocation_strategy is None


def test_a_zone_option_keeps_its_zone_says_it_when_taken_and_is_parallelclusters_alone():
    zoned = {"instance_types": ["g5.12xlarge"], "capacity_type": "ondemand", "availability_zone": "us-east-1b"}
    run = {"instance_type": "g6.12xlarge", "capacity_type": "spot", "provider": "parallelcluster"}
    zones = ["us-east-1b"]  # the network's zone_subnet_cidrs
    order = capacity_order(CapacitySettings(fallback=[zoned]), **run, first_partition="gpu", zones=zones)
    assert [(o.partition, o.availability_zone) for o in order] == [("gpu", None), ("gpu-2", "us-east-1b")]
    priced = [order[0], order[1].model_copy(update={"usd_per_node_hour": 5.672})]
    move = decide([o.model_dump(mode="json") for o in priced], "gpu", parse_nodes(SHORT))  # as XCom carries it
    assert "gpu-2: g5.12xlarge on-demand in us-east-1b (that zone's subnet) at $5.67 per node-hour" in move.message("1")
    static = {**run, "provider": "static"}
    with pytest.raises(ValueError, match="a static cluster's partition decides where its nodes are"):
        capacity_order(CapacitySettings(fallback=[{**zoned, "partition": "b"}]), **static, first_partition="compute")
    with pytest.raises(ValueError, match="is not an availability zone's name"):
        CapacitySettings(fallback=[{**zoned, "availability_zone": "b; rm"}])


def test_what_parallelcluster_would_refuse_is_refused_in_the_profile():
    ondemand = {
        "instance_types": ["g5.12xlarge"],
        "capacity_type": "ondemand",
        "allocation_strategy": "capacity-optimized",
    }
    with pytest.raises(RunSpecError, match="on-demand capacity takes lowest-price or prioritized"):
        resolve_run_spec("aws-gpu", {"capacity": {"fallback": [ondemand]}})
    with pytest.raises(RunSpecError, match="a capacity reservation is on-demand capacity"):
        spot = {
            "instance_types": ["g5.12xlarge"],
            "capacity_type": "spot",
            "capacity_reservation_id": "cr-0123456789abcdef0",
        }
        resolve_run_spec("aws-gpu", {"capacity": {"fallback": [spot]}})


def test_the_estimate_prices_the_dearest_option_never_the_cheaper_first():
    """g6.12xlarge spot first (no spot history here: bounded by its on-demand price), g5.12xlarge on-demand
    after it: the maximum is the fallback's, and the summary says on-demand."""
    fallback = [{"instance_types": ["g5.12xlarge"], "capacity_type": "ondemand"}]
    capacity = {"instance_types": [], "fallback": fallback}
    run = make_planned_run("aws-gpu", instance_type="g6.12xlarge", capacity=capacity)
    estimate = plan_cost(run)
    cost = estimate.cost
    assert cost["compute_per_node_hour"] == G5_12XLARGE and cost["priced_capacity_type"] == "ondemand"
    assert [o.usd_per_node_hour for o in estimate.capacity_order] == [G6_12XLARGE, G5_12XLARGE]
    assert [o.usd_per_node_hour for o in run.capacity_order] == [None, None]  # the planned run is not changed
    assert "2 x g5.12xlarge on-demand at $5.67/h" in cost["summary"]
    assert "the dearest of the run's capacity options" in cost["summary"]


def test_the_bill_after_a_fallback_prices_the_capacity_the_job_ran_on():
    """The metrics stage prices the nodes as the last move left them (the train task's `capacity_moves`)."""
    from pcflow.metrics.operators import HarvestMetricsOperator

    moved = {"capacity_moves": [{"from": "gpu", "to": "gpu-2", **ORDER[1]}]}
    kwargs = {
        "task_id": "metrics",
        "bucket": "b",
        "stack": "s",
        "instance_type": "g6.12xlarge",
        "capacity_type": "spot",
    }
    assert HarvestMetricsOperator(job=moved, **kwargs).capacity_used() == ("g5.12xlarge", "ondemand", None)
    assert HarvestMetricsOperator(job={"capacity_moves": []}, **kwargs).capacity_used() == ("g6.12xlarge", "spot", None)
    zoned = {"capacity_moves": [{"from": "gpu", "to": "gpu-2", **ORDER[0], "availability_zone": "us-east-1b"}]}
    assert HarvestMetricsOperator(job=zoned, **kwargs).capacity_used() == ("g6.12xlarge", "spot", "us-east-1b")
