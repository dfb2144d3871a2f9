"""A sweep's trials side by side against one at a time (issue 27): six 1-node trials as one Slurm job array
on the local stack's three nodes, throttled `%3` (what the local profile's `sweep.max_parallel` gives, each
element on a node of its own: `--exclusive`) and, as the named peer in the same run, the same six with
`%1` (one trial at a time: how a sweep ran where only one trial fits the cluster). Both go through
pcflow's SlurmArrayJobOperator and its wait (the trigger), as the sweep's train task does.

Each trial is the same small program: `--epochs` evaluations, `--epoch-seconds` apart, each written to
the trial's metrics.jsonl as a payload's are. Its work is a fixed time rather than CPU: the three local
"nodes" are slurmd daemons sharing this host's CPUs (2 cores, shared with the other agents' stacks), so
a CPU-bound trial would measure the host's contention, not how the sweep uses its nodes; on a cluster
each trial's node is its own. Per mode: wall time from submission to the wait's completion event, the
most trials seen running at once (each trial records its own start and end), the nodes each used, and
whether two trials that overlapped ever shared a node.

Usage: .venv/bin/python benchmarks/sweep_parallel.py [--trials 6] [--at-once 3] [--epochs 4] [--epoch-seconds 5]
Needs the local stack (started when down); prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "plugins"), str(REPO / "tests")]
os.environ.setdefault("AIRFLOW_HOME", str(REPO / ".stack" / "airflow"))

from stacktools import start_for_script  # noqa: E402
from taskcontext import deferred_trigger, make_context  # noqa: E402

from pcflow.slurm.operators import SlurmArrayJobOperator  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "sweep_parallel.json"
GOAL = "6 one-node trials on 3 nodes side by side finish in <= 0.5x the wall time of the same 6 one at a time"

#: One trial: its start, `epochs` evaluations of a made-up accuracy (better with its lr), its end.
TRIAL = r"""
import json, os, socket, sys, time
epochs, pause = int(sys.argv[1]), float(sys.argv[2])
run_dir = os.environ["PCFLOW_RUN_DIR"]
lr = json.load(open(os.environ["PCFLOW_HPARAMS"]))["lr"]
started = time.time()
with open(os.environ["PCFLOW_METRICS_FILE"], "a") as metrics:
    for epoch in range(epochs):
        time.sleep(pause)
        value = 1 - 1 / (2 + epoch * lr * 100)
        line = {"time": time.time(), "epoch": epoch, "step": epoch, "name": "acc", "value": value, "split": "eval"}
        metrics.write(json.dumps(line) + "\n")
        metrics.flush()
times = {"start": started, "end": time.time(), "node": os.environ.get("SLURMD_NODENAME", socket.gethostname())}
open(os.path.join(run_dir, "times.json"), "w").write(json.dumps(times))
"""


def run_sweep(label: str, trials: int, at_once: int, epochs: int, seconds: float) -> dict:
    """Submit the array, wait for its completion event as the triggerer would; the trials' own records."""
    op = SlurmArrayJobOperator(
        task_id=f"sweep-{label}",
        program=["python3", "-c", TRIAL, str(epochs), str(seconds)],
        trials=[{"lr": 0.001 * (i + 1)} for i in range(trials)],
        max_parallel=at_once,
        allocation={"nodes": 1, "time_limit": "10:00"},
        deferrable=True,  # the wait below is the trigger's, as in a triggerer
    )
    context = make_context(op.task_id)
    started = time.time()
    trigger = deferred_trigger(op, context)
    event = asyncio.run(_first(trigger))
    wall = time.time() - started
    result = op.execute_complete(context, event)
    records = [json.loads((Path(t["run_dir"]) / "times.json").read_text()) for t in result["trials"]]
    return {"wall_s": round(wall, 2), "event": event, "records": records, "result": result}


async def _first(trigger) -> dict:
    async for event in trigger.run():
        return event.payload
    raise RuntimeError("the array's wait ended without an event")


def most_at_once(records: list[dict]) -> int:
    """The most trials running at the same moment (their recorded start and end)."""
    moments = sorted([(r["start"], 1) for r in records] + [(r["end"], -1) for r in records], key=lambda m: (m[0], m[1]))
    running = peak = 0
    for _, step in moments:
        running += step
        peak = max(peak, running)
    return peak


def shared_a_node(records: list[dict]) -> bool:
    """Whether two trials that ran at the same time ran on the same node."""
    return any(
        a["node"] == b["node"] and a["start"] < b["end"] and b["start"] < a["end"]
        for i, a in enumerate(records)
        for b in records[i + 1 :]
    )


def summary(run: dict) -> dict:
    records = run["records"]
    return {
        "wall_s": run["wall_s"],
        "succeeded": run["event"]["status"] == "success"
        and all(t["outcome"] == "success" for t in run["result"]["trials"]),
        "most_trials_at_once": most_at_once(records),
        "nodes_used": sorted({r["node"] for r in records}),
        "overlapping_trials_shared_a_node": shared_a_node(records),
        "trial_seconds": [round(r["end"] - r["start"], 2) for r in records],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--at-once", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--epoch-seconds", type=float, default=5.0)
    args = parser.parse_args()

    start_for_script()
    parallel = summary(run_sweep("parallel", args.trials, args.at_once, args.epochs, args.epoch_seconds))
    serial = summary(run_sweep("serial", args.trials, 1, args.epochs, args.epoch_seconds))
    ratio = round(parallel["wall_s"] / serial["wall_s"], 3)
    result = {
        "benchmark": "sweep_parallel",
        "metrics": {
            "trials": args.trials,
            "nodes_per_trial": 1,
            "trials_at_once": args.at_once,
            "trial_work_s": args.epochs * args.epoch_seconds,
            "parallel": parallel,
            "wall_ratio_parallel_over_one_at_a_time": ratio,
            "speedup": round(serial["wall_s"] / parallel["wall_s"], 2),
        },
        "peers": {"the same array with %1 (one trial at a time)": serial},
        "goal": GOAL,
        "goal_met": parallel["succeeded"]
        and serial["succeeded"]
        and ratio <= 0.5
        and not parallel["overlapping_trials_shared_a_node"],
        "host": "local stack on a 2-core machine shared with 5 other agents' stacks and tests (timings are noisy)",
    }
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
