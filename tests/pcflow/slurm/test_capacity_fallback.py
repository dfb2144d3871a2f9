"""The ICE fallback (issue 27.3) on the real Slurm of the local stack: a job pending in a partition whose node
ParallelCluster could not launch (the pcluster stand-in's `carve_partitions`, which leaves the node as
slurm_resume does: DOWN, `(Code:InsufficientInstanceCapacity)Failure when resuming nodes`) is moved by the
train wait to the next capacity option's partition, runs there, and the result says what it did. Without the
fallback the job would wait there until its pending timeout."""

from __future__ import annotations

import sys
import uuid

import pytest
from stacktools import LocalStack
from taskcontext import deferred_trigger, first_event, make_context

from pcflow.paths import include_dir
from pcflow.slurm.hook import SlurmHook
from pcflow.slurm.operators import SlurmJobOperator

pytestmark = pytest.mark.stack


@pytest.fixture
def standin(local_stack: LocalStack):
    """include/local/pcluster_standin.py, for its Slurm side of ParallelCluster's capacity errors."""
    sys.path.insert(0, str(include_dir() / "local"))
    import pcluster_standin

    return pcluster_standin


def test_a_job_pending_for_insufficient_capacity_moves_to_the_next_option_and_runs(slurm: SlurmHook, standin):
    short, fallback = f"ice{uuid.uuid4().hex[:6]}", f"fb{uuid.uuid4().hex[:6]}"
    carved = standin.carve_partitions([short, fallback], short)
    try:
        order = [
            {"partition": short, "instance_types": ["g6.12xlarge"], "capacity_type": "spot"},
            {
                "partition": fallback,
                "instance_types": ["g5.12xlarge"],
                "capacity_type": "ondemand",
                "usd_per_node_hour": 5.672,
            },
        ]
        op = SlurmJobOperator(
            task_id="ice",
            program=["bash", "-c", 'echo "ran in $SLURM_JOB_PARTITION on $SLURMD_NODENAME"'],
            allocation={"partition": short, "nodes": 1},
            capacity=order,
            pending_timeout=120,  # a bound on a broken fallback, not a timing assertion
            poll_interval=0.2,
            confirm_interval=1.0,
        )
        context = make_context("ice")
        trigger = deferred_trigger(op, context)
        result = op.execute_complete(context, first_event(trigger))
    finally:
        standin.release_partitions([short, fallback])
    assert result["state"] == "COMPLETED"
    (move,) = result["capacity_moves"]
    assert (move["from"], move["to"], move["code"]) == (short, fallback, "InsufficientInstanceCapacity")
    assert move["capacity_type"] == "ondemand" and move["usd_per_node_hour"] == 5.672
    log = slurm.read_file(result["log"]).decode()
    assert f"ran in {fallback} on " in log and result["nodes"] in carved[fallback]
