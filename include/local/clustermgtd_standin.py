"""STAND-IN for ParallelCluster's clustermgtd (the head node's cluster management daemon) on the local stack: its
static-capacity care, for the one case the local stack meets, a node Slurm drained as "Duplicate jobid".

What ParallelCluster does: static nodes "are not terminated by the system, unless a particular event or
condition occurs. Such events include, for example, the failure of Slurm or Amazon EC2 health checks and the
change of the Slurm node status to DRAIN or DOWN"
(https://docs.aws.amazon.com/parallelcluster/latest/ug/slurm-cluster-capacity-size-and-update.html);
clustermgtd's "static capacity management: make sure static capacity is always up and healthy" and its
"unhealthy scheduler nodes management" find them in a loop (every 60 s by default) and replace them
(https://docs.aws.amazon.com/parallelcluster/latest/ug/processes-v3.html): the node is set DOWN with the reason
`Static node maintenance: unhealthy node is being replaced` (aws-parallelcluster-node, slurm_plugin/clustermgtd.py),
its instance terminated, a new one launched, and the node is back in service once that one registers. A drained
node still running jobs keeps running them and is replaced once they complete (aws-parallelcluster's wiki,
"(3.1.1) Issue with clusters in isolated networks").

What the stand-in does: the same, every LOOP_S, for drained static nodes without jobs whose reason is one of
REPLACED_REASONS, in one step: RESUME. There is no instance to replace (the node is its own slurmd, still up), and
a node set DOWN here stays "not responding" until slurmd's next answer to slurmctld.

slurmctld drains a node "Duplicate jobid" when it was killed as a job started: recovering a state saved
before the start, it finds the node running a job it thinks pending (docs/reliability.md, the slurmctld fault);
on AWS clustermgtd would replace that node within a minute, so a local run must not find it drained forever.
Unlike clustermgtd it leaves every other drained or down node alone: the local stack's tests drain and down nodes
on purpose (tests/pcflow/cluster/test_static.py, `stack.py fail-node`, the pcluster stand-in's capacity carve)
and count on them staying so until they put them back.

Run by the local stack as its `clustermgtd` service (include/local/stack.py); `replace_drained_nodes` is one pass.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stack as local_stack  # include/local/stack.py: this stack's Slurm

#: clustermgtd's loop is 60 s (its `loop_time`); the local stand-in looks more often: a run and a test wait on it
#: (stack.py's readiness check wants a pass within 30 s).
LOOP_S = 10
#: Drain reasons the stand-in replaces nodes for (slurmctld writes `Duplicate jobid`).
REPLACED_REASONS = ("Duplicate jobid",)


def drained_nodes(lay: local_stack.Layout) -> dict[str, str]:
    """Nodes drained without jobs (sinfo's `drained`, not `draining`) -> their reason."""
    listed = local_stack.run(["sinfo", "-h", "-N", "-o", "%N|%T|%E"], env=lay.slurm_env(), check=False, timeout=30)
    nodes = {}
    for line in listed.stdout.splitlines() if listed.returncode == 0 else ():
        name, state, reason = [*line.split("|", 2), "", ""][:3]
        if state.rstrip("*~#!%$@^-") == "drained":
            nodes[name] = reason
    return nodes


def replace_drained_nodes(lay: local_stack.Layout) -> list[str]:
    """One pass of the stand-in: each drained node whose reason is one of REPLACED_REASONS back in service (what
    the node's replacement comes to here). Returns those nodes."""
    drained = drained_nodes(lay)
    replaced = sorted(name for name, reason in drained.items() if reason.startswith(REPLACED_REASONS))
    for name in replaced:
        local_stack.run(["scontrol", "update", f"NodeName={name}", "State=RESUME"], env=lay.slurm_env(), check=False)
        print(f"replaced {name} (drained: {drained[name]})", flush=True)
    return replaced


def main() -> None:
    """The daemon: a pass every LOOP_S (a pass that fails, slurmctld being away, is tried again the next time);
    `alive` says the loop runs (the stack's readiness check)."""
    lay = local_stack.load_layout(create=False)
    alive = lay.path("clustermgtd", "alive")
    alive.parent.mkdir(exist_ok=True)
    while True:
        try:
            replace_drained_nodes(lay)
        except Exception as exc:  # slurmctld down or slow: the next pass tries again, as clustermgtd's loop does
            print(f"pass failed: {exc}", flush=True)
        alive.write_text(str(time.time()))
        time.sleep(LOOP_S)


if __name__ == "__main__":
    main()
