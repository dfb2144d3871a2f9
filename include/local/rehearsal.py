"""`make rehearsal`: the production profile, `aws-gpu`, on the local stack, with two `pretrain` runs and a
4-trial `pretrain_sweep` on one stack at once (include/local/many_runs.py: one shared network, a cluster per
run, each run's time to first job, and the `concurrent:` line); the first `pretrain` run is summarized in
full. The `aws-gpu-rehearsal` profile is aws-gpu.yaml with only what the emulator needs changed (each
line says why); everything else is the production path: network, bake, shard load, config render, the
real `pcluster --dryrun`, create (the pcluster stand-in: its cluster is the local Slurm), FSx link
(the FSx stand-in: a local directory the nodes see at /fsx), torchrun, metrics, FSx export, delete.

Prints the demo's summary plus the nodes the job ran on, the launcher, the dataset's mode and shard
count, the model's S3 URI and what is left; exits non-zero if the run failed or left anything behind.
Every AWS call the run makes, pcluster's and what the stand-in does for the cluster included, is
recorded (pcflow.aws.calllog) and judged against the shipped IAM policy of whoever makes it on AWS
(iam_calls.py): the summary's `iam` says how many calls and how many were denied; one denied fails it.
Tests (and other DAGs' rehearsals, e.g. the nightly's) write an admin profile over PROFILE with
`own_stack` (dagrun.write_profile) and read the run with `rehearsal_facts`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from dagrun import REPO, DagRunResult
from demo import prepare, report, summarize
from iam_calls import evaluate, read_calls

PROFILE = "aws-gpu-rehearsal"


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


def iam_check(log: Path) -> dict[str, Any]:
    """The recorded calls judged against the shipped policies; none recorded means the log did not work."""
    iam = evaluate(read_calls(log))
    if iam["calls"] == 0:
        iam["denials"] = [f"no AWS call recorded in {log}"]
    return iam


def main() -> int:
    import many_runs

    from pcflow.aws.calllog import paused, recording

    prepare()
    print(f"pcflow rehearsal: two `pretrain` runs and a 4-trial sweep at once, profile {PROFILE} (aws-gpu) ...")
    stack_dir = Path(os.environ.get("PCFLOW_STACK_DIR", REPO / ".stack"))
    log = stack_dir / "logs" / f"rehearsal-aws-calls-{os.getpid()}.jsonl"
    with recording(log):  # the runs' processes, and the pcluster CLI they start, record theirs too
        results = many_runs.run_many(PROFILE)
    with paused():  # the summaries' own lookups are not the runs'
        first = results.get("pretrain-1")
        single = 1
        if first is not None:
            summary = {**summarize(first, first.seconds), **rehearsal_facts(first), "iam": iam_check(log)}
            single = report("rehearsal", summary)
        return many_runs.report(results) or single


if __name__ == "__main__":
    sys.exit(main())
