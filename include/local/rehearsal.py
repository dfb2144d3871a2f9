"""`make rehearsal`: the `pretrain` DAG end to end with the production profile, `aws-gpu`, on the local
stack. The `aws-gpu-rehearsal` profile is aws-gpu.yaml with only what the emulator needs changed (each
line says why); everything else is the production path: network, bake, shard load, config render, the
real `pcluster --dryrun`, create (the pcluster stand-in: its cluster is the local Slurm), FSx link
(the FSx stand-in: a local directory the nodes see at /fsx), torchrun, metrics, FSx export, delete.

Prints the demo's summary plus the nodes the job ran on, the launcher, the dataset's mode and shard
count, the model's S3 URI and what is left; exits non-zero if the run failed or left anything behind.
Tests (and other DAGs' rehearsals, e.g. the nightly's) write an admin profile over PROFILE with
`own_stack` (dagrun.write_profile) and read the run with `rehearsal_facts`.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from dagrun import DagRunResult
from demo import prepare, report, run_with_progress, summarize

PROFILE = "aws-gpu-rehearsal"
CONF = {"profile": PROFILE, "partition": "rehearsal"}


def own_stack(stack: str) -> dict[str, Any]:
    """Settings (an admin's: the stack is the profile's) that give a rehearsal a stack of its own, its data
    bucket included (`pcflow-<stack>-data`), so `dagrun.remove_stack(stack)` removes every trace."""
    return {"stack": stack, "dataset": {"bucket": f"pcflow-{stack}-data"}}


def node_names(node_list: str | None) -> list[str]:
    """Slurm's hostlist (`node[1-2]`) as names, expanded by Slurm itself."""
    if not node_list:
        return []
    out = subprocess.run(["scontrol", "show", "hostnames", node_list], capture_output=True, text=True, check=False)
    return out.stdout.split() if out.returncode == 0 else [node_list]


def rehearsal_facts(result: DagRunResult) -> dict[str, Any]:
    """What the production profile does that the demo's does not, as the run's tasks report it."""
    out = result.returned
    run, train, dataset = out.get("validate") or {}, out.get("train") or {}, out.get("dataset") or {}
    metrics, cluster = out.get("metrics") or {}, out.get("cluster") or {}
    deleted = out.get("delete_cluster") or {}
    return {
        "profile": run.get("profile"),
        "cluster": {k: cluster.get(k) for k in ("provider", "name", "head_node", "mounts")},
        "nodes": node_names(train.get("nodes")),
        "launcher": (run.get("training") or {}).get("launcher"),
        "dataset_mode": dataset.get("mode"),
        "shard_count": dataset.get("object_count") if dataset.get("mode") == "shard" else None,
        "fsx_exports": [
            {"task_id": e["task_id"], "lifecycle": e["lifecycle"], "files": (e.get("status") or {}).get("TotalCount")}
            for e in deleted.get("exports") or ()
        ],
        "model_uri": (metrics.get("model") or {}).get("model"),  # s3://<bucket>/runs/<run key>/model/...
    }


def main() -> int:
    prepare()
    print(f"pcflow rehearsal: running DAG `pretrain` with profile {PROFILE} (aws-gpu on the local stack) ...")

    def summarize_rehearsal(result: DagRunResult, seconds: float) -> dict[str, Any]:
        return {**summarize(result, seconds), **rehearsal_facts(result)}

    return report("rehearsal", run_with_progress("rehearsal", "pretrain", CONF, summarize_rehearsal))


if __name__ == "__main__":
    sys.exit(main())
