"""The clustermgtd stand-in (include/local/clustermgtd_standin.py) on the real local Slurm: a node slurmctld
drained "Duplicate jobid" (as after slurmctld was killed while a job started, docs/reliability.md) is put back in
service, as ParallelCluster's clustermgtd replaces an unhealthy static node; a node drained for any other reason
(a test's, an admin's) is left drained."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from stacktools import LocalStack

from pcflow.paths import include_dir

pytestmark = pytest.mark.stack

#: How long the stack's clustermgtd service gets to make its pass (it loops every LOOP_S): a bound on a broken
#: stand-in, not a timing assertion.
DAEMON_BOUND_S = 120


@pytest.fixture
def standin(local_stack: LocalStack):
    sys.path.insert(0, str(include_dir() / "local"))
    import clustermgtd_standin

    return clustermgtd_standin


def slurm_env(stack: LocalStack) -> dict[str, str]:
    return {**os.environ, "SLURM_CONF": str(stack.state_dir / "slurm" / "etc" / "slurm.conf")}


def scontrol(stack: LocalStack, *argv: str, check: bool = True) -> None:
    subprocess.run(["scontrol", *argv], env=slurm_env(stack), check=check, timeout=60)


def node(stack: LocalStack, name: str) -> tuple[str, str]:
    """sinfo's state and reason of one node; its `*` (not responding: for a moment after its slurmd started, or
    under load) dropped, which is slurmd's business, not the stand-in's."""
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-n", name, "-o", "%T|%E"],
        env=slurm_env(stack),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    state, _, reason = out.partition("|")
    return state.rstrip("*"), reason


def drain(stack: LocalStack, name: str, reason: str) -> None:
    scontrol(stack, "update", f"NodeName={name}", "State=DRAIN", f"Reason={reason}")
    assert node(stack, name) == ("drained", reason)


def test_a_pass_replaces_a_node_drained_for_a_duplicate_job_id_and_leaves_others(local_stack, standin):
    lay = standin.local_stack.load_layout(create=False)
    drain(local_stack, "node3", "Duplicate jobid")
    drain(local_stack, "node2", "drained by a test on purpose")
    try:
        assert standin.replace_drained_nodes(lay) == ["node3"]
        assert node(local_stack, "node3") == ("idle", "none")
        assert node(local_stack, "node2") == ("drained", "drained by a test on purpose")
    finally:
        for name in ("node2", "node3"):  # whatever the test left (resuming an idle node is refused: no matter)
            scontrol(local_stack, "update", f"NodeName={name}", "State=RESUME", check=False)


def test_the_stack_runs_it_as_clustermgtd_does(local_stack, standin):
    """The stack's own `clustermgtd` service resumes the node without anyone calling it."""
    drain(local_stack, "node3", "Duplicate jobid")
    try:
        deadline = time.monotonic() + DAEMON_BOUND_S
        while node(local_stack, "node3")[0] != "idle" and time.monotonic() < deadline:
            time.sleep(1)
        assert node(local_stack, "node3") == ("idle", "none")
    finally:
        scontrol(local_stack, "update", "NodeName=node3", "State=RESUME", check=False)
