"""How fast pcflow notices that a Slurm job ended, what the wait costs slurmctld, and what a sweep's
submission costs in SSH connections — against the SSH provider's SSHRemoteJobOperator (defaults),
measured in the same run on the local stack.

Latency: each job's program writes `time.time()` as its last act; the latency is the time from
then until the waiting side yields its completion event. All waits of one side run concurrently in
one event loop, as in a triggerer.

Usage: .venv/bin/python benchmarks/slurm_wait.py [--jobs 12] [--job-seconds 8] [--trials 100]
Needs the local stack (`make stack-up`); prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

import paramiko

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "plugins"), str(REPO / "tests")]
os.environ.setdefault("AIRFLOW_HOME", str(REPO / ".stack" / "airflow"))

from airflow.sdk.exceptions import TaskDeferred  # noqa: E402
from stacktools import start_for_script  # noqa: E402
from taskcontext import make_context  # noqa: E402

from pcflow.slurm.hook import SlurmHook  # noqa: E402
from pcflow.slurm.operators import SlurmArrayJobOperator, SlurmJobOperator  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "slurm_wait.json"
GOAL = "median completion-detection latency <= 2 s with <= 1 slurmctld query per job per 30 s of waiting"


class ConnectionCounter:
    """Counts SSH connections opened by paramiko (what each Airflow task process would open)."""

    def __init__(self) -> None:
        self.count = 0
        self._original = paramiko.SSHClient.connect

    def __enter__(self) -> ConnectionCounter:
        counter = self

        def counting_connect(client, *args, **kwargs):
            counter.count += 1
            return counter._original(client, *args, **kwargs)

        paramiko.SSHClient.connect = counting_connect
        return self

    def __exit__(self, *exc) -> None:
        paramiko.SSHClient.connect = self._original


def end_stamp_program(shared: Path, seconds: float) -> tuple[list[str], Path]:
    stamp = shared / "bench" / f"end-{uuid.uuid4().hex}"
    code = f"import time; time.sleep({seconds}); open({str(stamp)!r}, 'w').write(repr(time.time()))"
    return ["python3", "-c", code], stamp


async def submit_and_wait(submit, jobs: int) -> list[dict]:
    """Submit job after job (in a thread, as a worker would) and start waiting on each at once."""

    async def wait(trigger, stamp: Path) -> dict:
        async for event in trigger.run():
            received = time.time()
            ended = float(stamp.read_text()) if stamp.exists() else None
            latency = received - ended if ended else None
            return {"event": event.payload, "latency_s": latency, "trigger": trigger}
        raise RuntimeError("no event")

    waits = []
    for i in range(jobs):
        trigger, stamp = await asyncio.to_thread(submit, i)
        waits.append(asyncio.create_task(wait(trigger, stamp)))
    return await asyncio.gather(*waits)


def deferred_trigger(op, context):
    try:
        op.execute(context)
    except TaskDeferred as deferred:
        return deferred.trigger
    raise RuntimeError(f"{op.task_id} did not defer")


def summary(results: list[dict]) -> dict:
    return {
        "latencies_s": [round(r["latency_s"], 3) for r in results],
        "median_latency_s": round(statistics.median(r["latency_s"] for r in results), 3),
        "all_succeeded": all(r["event"]["status"] == "success" for r in results),
    }


def measure_pcflow(shared: Path, jobs: int, seconds: float) -> dict:
    def submit(i: int):
        program, stamp = end_stamp_program(shared, seconds)
        op = SlurmJobOperator(task_id=f"bench-{i}", program=program)  # default poll/confirm intervals
        trigger = deferred_trigger(op, make_context(f"bench-{i}"))
        trigger.started = time.time()
        return trigger, stamp

    results = asyncio.run(submit_and_wait(submit, jobs))
    rates = [r["trigger"].queries_sent / max(1.0, (time.time() - r["trigger"].started) / 30) for r in results]
    return {
        **summary(results),
        "slurmctld_queries_per_job": [r["trigger"].queries_sent for r in results],
        "max_queries_per_job_per_30s": round(max(rates), 3),
    }


def measure_ssh_remote_job(shared: Path, jobs: int, seconds: float) -> dict:
    """The peer: SSHRemoteJobOperator (defaults: poll every 5 s) running `srun` of the same program."""
    from airflow.providers.ssh.operators.ssh_remote_job import SSHRemoteJobOperator

    def submit(i: int):
        program, stamp = end_stamp_program(shared, seconds)
        command = " ".join(["srun", f"--job-name=peer-{i}", *[json.dumps(a) for a in program]])
        op = SSHRemoteJobOperator(
            task_id=f"peer-{i}", ssh_conn_id="slurm_default", command=command, remote_base_dir=str(shared / "peer")
        )
        return deferred_trigger(op, make_context(f"peer-{i}")), stamp

    return summary(asyncio.run(submit_and_wait(submit, jobs)))


def measure_submission(trials: int) -> dict:
    """A sweep of `trials`: one task per trial (each a process with its own SSH connection) vs one array."""
    hook = SlurmHook()
    program = ["sleep", "300"]  # never runs long: cancelled right after submission
    out = {}

    with ConnectionCounter() as counted:
        start = time.perf_counter()
        submitted = []
        for i in range(trials):
            op = SlurmJobOperator(task_id=f"one-{i}", program=program)
            submitted.append(deferred_trigger(op, make_context(f"one-{i}")).job_id)
            op.hook.close()
        out["one_by_one"] = {"wall_s": round(time.perf_counter() - start, 2), "ssh_connections": counted.count}
    hook.run(["scancel", *submitted], check=False)

    with ConnectionCounter() as counted:
        start = time.perf_counter()
        op = SlurmArrayJobOperator(task_id="array", program=program, trials=[{"trial": i} for i in range(trials)])
        array_id = deferred_trigger(op, make_context("array")).job_id
        op.hook.close()
        out["array"] = {"wall_s": round(time.perf_counter() - start, 2), "ssh_connections": counted.count}
    hook.run(["scancel", array_id], check=False)
    hook.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=12)
    parser.add_argument("--job-seconds", type=float, default=8.0)
    parser.add_argument("--trials", type=int, default=100)
    args = parser.parse_args()

    shared = start_for_script()
    (shared / "bench").mkdir(parents=True, exist_ok=True)

    pcflow = measure_pcflow(shared, args.jobs, args.job_seconds)
    peer = measure_ssh_remote_job(shared, args.jobs, args.job_seconds)
    submission = measure_submission(args.trials)
    result = {
        "benchmark": "slurm_wait",
        "metrics": {
            "jobs": args.jobs,
            "job_seconds": args.job_seconds,
            "pcflow_median_latency_s": pcflow["median_latency_s"],
            "pcflow_max_slurmctld_queries_per_job_per_30s": pcflow["max_queries_per_job_per_30s"],
            "pcflow_all_succeeded": pcflow["all_succeeded"],
            "pcflow_latencies_s": pcflow["latencies_s"],
            "pcflow_queries_per_job": pcflow["slurmctld_queries_per_job"],
            f"submit_{args.trials}_trials": submission,
        },
        "peers": {
            "SSHRemoteJobOperator(defaults) + srun": {
                "median_latency_s": peer["median_latency_s"],
                "latencies_s": peer["latencies_s"],
                "all_succeeded": peer["all_succeeded"],
                "latency_ratio_peer_over_pcflow": round(peer["median_latency_s"] / pcflow["median_latency_s"], 2),
            }
        },
        "goal": GOAL,
        "goal_met": pcflow["median_latency_s"] <= 2.0 and pcflow["max_queries_per_job_per_30s"] <= 1.0,
    }
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
