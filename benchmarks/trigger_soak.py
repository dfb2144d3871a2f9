"""Triggerer memory per wait over a long soak (Airflow #65950: a triggerer's memory grew with every wait it
had run): a steady population of pcflow waits on one head node for --minutes, each ended wait replaced by
a new one, against the synthetic Slurm (benchmarks/synthetic_slurm.py) over the local stack's real sshd.

The harness plays the cluster: --waits jobs at once, each running --min-job-seconds to --max-job-seconds,
a new job submitted the moment one ends (so Slurm always holds --waits running jobs, and the triggerer
about as many waits). A child process plays the triggerer, every wait's run() on one event loop as in
trigger_scale.py, starting each job's wait when the job is submitted, and every --sample-seconds records
its resident memory, the waits in flight, the waits done so far, Python's allocated blocks and the
session's own tables. The result says whether memory per wait stays flat: the resident memory's slope
after the first turnover of waits (MB per hour, and per 1,000 waits run), beside the first and last
samples' memory per wait. Run directories of waits long over are removed as it goes.

Usage: .venv/bin/python benchmarks/trigger_soak.py [--minutes 60] [--waits 1000] [--sample-seconds 30]
Needs the local stack (started when down); writes benchmarks/results/trigger_soak.json and prints it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "plugins"), str(REPO / "tests"), str(REPO / "benchmarks")]
os.environ.setdefault("AIRFLOW_HOME", str(REPO / ".stack" / "airflow"))

import synthetic_slurm  # noqa: E402  (benchmarks/, on the path above)

RESULTS = REPO / "benchmarks" / "results" / "trigger_soak.json"
NOTE = (
    "ssh_connections_opened: every connection the stack's sshd accepted during the soak, other clients of the same "
    "sshd included (tests, benchmarks); the waits' own: session_connections_opened in the samples (the triggerer's "
    "log says when it reconnected)."
)
#: Every FAIL_EVERY-th job exits 3: its wait must say failed (Slurm asked through sacct), as in trigger_scale.
FAIL_EVERY = 20
#: The child starts each wait this long after the harness submitted its job (its directory exists).
START_LAG_S = 1.0


def schedule(waits: int, minutes: float, low: float, high: float) -> list[dict]:
    """Every job of the soak: when it is submitted and when it ends (epoch offsets from the start). The first
    `waits` start at once and end spread over the mean length; each later one is submitted when one ends."""
    mean, span = (low + high) / 2, high - low
    jobs, ends = [], []
    for k in range(waits):
        jobs.append({"submit": 0.0, "end": 10 + mean * (k + 1) / waits})
        ends.append(jobs[-1]["end"])
    ends.sort()
    k, horizon = waits, minutes * 60
    while ends and ends[0] < horizon:
        submit = ends.pop(0)
        length = low + (k * 7919 % 1000) / 1000 * span  # spread evenly, the same every run
        jobs.append({"submit": submit, "end": submit + length})
        insert_sorted(ends, submit + length)
        k += 1
    return jobs


def insert_sorted(values: list[float], value: float) -> None:
    """Insert into a sorted list (bisect keeps the schedule's loop linear enough for 20,000 jobs)."""
    import bisect

    bisect.insort(values, value)


def run(args: argparse.Namespace) -> dict:
    """The harness: install the synthetic Slurm, start the child, play the schedule until the soak ends."""
    from stacktools import start_for_script
    from trigger_scale import SshdWatch, pcflow_triggers

    from pcflow.slurm.operators import SlurmJobOperator
    from pcflow.slurm.spec import RunDir

    shared = start_for_script()
    stack_dir = Path(os.environ["PCFLOW_STACK_DIR"])
    work = stack_dir / "bench" / "soak"
    shutil.rmtree(work, ignore_errors=True)
    fake = synthetic_slurm.install(work / "slurm")
    table = synthetic_slurm.JobTable(fake, forget_after=360.0)
    run_key = f"bench-soak-{uuid.uuid4().hex[:8]}"
    first = synthetic_slurm_first_id()
    plan = schedule(args.waits, args.minutes, args.min_job_seconds, args.max_job_seconds)
    template = pcflow_triggers(
        [
            {
                "op": SlurmJobOperator(task_id="t0", program=["true"]),
                "run_dir": RunDir.for_job(str(shared), run_key, "t0"),
            }
        ],
        [str(first)],
    )[0]
    template[1].update(slurm_bin=str(fake), accounting=True)
    t0 = time.time() + 15  # the child's imports first
    spec = {
        "template": template,
        "first_id": first,
        "t0": t0,
        "plan": plan,
        "run_parent": str(Path(template[1]["run_dir"]).parent),
    }
    spec.update(minutes=args.minutes, sample_s=args.sample_seconds)
    (work / "spec.json").write_text(json.dumps(spec))
    sshd_port = json.loads((stack_dir / "ports.json").read_text())["sshd"]
    with SshdWatch(stack_dir, sshd_port) as sshd, open(work / "triggerer.log", "wb") as log:
        child = subprocess.Popen([sys.executable, __file__, "--wait", str(work)], stdout=log, stderr=subprocess.STDOUT)
        play(table, spec, child)
    if child.returncode != 0:
        raise RuntimeError(f"the waiting process failed ({child.returncode}); see {work / 'triggerer.log'}")
    found = json.loads((work / "result.json").read_text())
    calls = synthetic_slurm.queries(fake)
    shutil.rmtree(spec["run_parent"], ignore_errors=True)
    return summary(found, args, calls, sshd)


def synthetic_slurm_first_id() -> int:
    """Job ids of this soak: above the stack's own and apart from trigger_scale's phases."""
    return 8_000_000 + int(time.time()) % 100_000 * 10


def play(table: synthetic_slurm.JobTable, spec: dict, child: subprocess.Popen) -> None:
    """Submit each job at its time, end it at its end, until the child is done; remove run directories of
    jobs the table forgot (their waits are long over)."""
    t0, plan, submitted = spec["t0"], spec["plan"], 0
    while child.poll() is None:
        now = time.time()
        while submitted < len(plan) and t0 + plan[submitted]["submit"] <= now:
            job_id = str(spec["first_id"] + submitted)
            run_dir = f"{spec['run_parent']}/t{submitted}"
            at = plan[submitted]
            code = 3 if submitted % FAIL_EVERY == FAIL_EVERY - 1 else 0
            table.submit(synthetic_slurm.Job(job_id, run_dir, "soak", t0 + at["submit"] + 0.5, t0 + at["end"], code))
            submitted += 1
        before = set(table.jobs)
        table.advance(now)
        for gone in before - set(table.jobs):
            shutil.rmtree(f"{spec['run_parent']}/t{int(gone) - spec['first_id']}", ignore_errors=True)
        time.sleep(0.1)


# -- the triggerer side ---------------------------------------------------------------------------


def rss_mb() -> float:
    """Resident memory now (not the peak: a leak shows as growth, a spike as nothing)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def soak(spec: dict) -> dict:
    """Start each job's wait at its submission, end when the soak's time is up; sample as it goes."""
    import structlog

    from pcflow.slurm.session import current_sessions
    from pcflow.slurm.trigger import SlurmJobTrigger

    t0, plan, template = spec["t0"], spec["plan"], spec["template"][1]
    end_at = t0 + spec["minutes"] * 60
    baseline = rss_mb()
    tasks: set[asyncio.Task] = set()
    done = {"events": 0, "wrong": 0, "detection": []}
    samples: list[dict] = []

    async def one(k: int) -> None:
        structlog.contextvars.bind_contextvars(trigger_id=k)
        run_dir = f"{spec['run_parent']}/t{k}"
        trigger = SlurmJobTrigger(**{**template, "job_id": str(spec["first_id"] + k), "run_dir": run_dir})
        async for event in trigger.run():
            received = time.time()
            done["events"] += 1
            meant = "failed" if k % FAIL_EVERY == FAIL_EVERY - 1 else "success"
            done["wrong"] += event.payload.get("status") != meant
            try:
                done["detection"].append(received - os.stat(f"{run_dir}/exit.json").st_mtime)
            except OSError:
                pass
            return

    async def sampler() -> None:
        while True:
            sessions = current_sessions()
            samples.append(
                {
                    "t_s": round(time.time() - t0, 1),
                    "waits_in_flight": sum(not t.done() for t in tasks),
                    "waits_done": done["events"],
                    "rss_mb": round(rss_mb(), 1),
                    "python_blocks": sys.getallocatedblocks(),
                    "session_seats": sum(len(s.seats) for s in sessions),
                    "session_connections_opened": sum(s.connections_opened for s in sessions),
                    "session_answers": sum(len(s.answers) for s in sessions),
                    "detection_median_s": round(statistics.median(done["detection"]), 3) if done["detection"] else None,
                }
            )
            done["detection"].clear()
            await asyncio.sleep(spec["sample_s"])

    await asyncio.sleep(max(0.0, t0 - time.time()))
    sampling = asyncio.create_task(sampler())
    for k, at in enumerate(plan):
        await asyncio.sleep(max(0.0, t0 + at["submit"] + START_LAG_S - time.time()))
        if time.time() >= end_at:
            break
        task = asyncio.create_task(one(k))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.sleep(max(0.0, end_at - time.time()))
    sampling.cancel()
    for task in list(tasks):
        task.cancel()
    return {"baseline_rss_mb": round(baseline, 1), "samples": samples, "wrong": done["wrong"]}


def summary(found: dict, args: argparse.Namespace, calls: dict, sshd) -> dict:
    """Memory per wait over time and the resident memory's slope after the first turnover."""
    samples, base = found["samples"], found["baseline_rss_mb"]
    for s in samples:
        s["kb_per_wait_in_flight"] = (
            round((s["rss_mb"] - base) * 1024 / s["waits_in_flight"], 1) if s["waits_in_flight"] else None
        )
    warm = [s for s in samples if s["t_s"] >= args.max_job_seconds + 30]
    slope = None
    if len(warm) >= 3:
        ts, rss = [s["t_s"] for s in warm], [s["rss_mb"] for s in warm]
        slope = statistics.linear_regression(ts, rss).slope * 3600
    ran = warm[-1]["waits_done"] - warm[0]["waits_done"] if len(warm) >= 2 else 0
    growth = warm[-1]["rss_mb"] - warm[0]["rss_mb"] if len(warm) >= 2 else None
    return {
        "benchmark": "trigger_soak",
        "minutes": args.minutes,
        "waits_at_once": args.waits,
        "job_seconds": [args.min_job_seconds, args.max_job_seconds],
        "waits_done": samples[-1]["waits_done"] if samples else 0,
        "waits_with_a_wrong_verdict": found["wrong"],
        "baseline_rss_mb": base,
        "rss_slope_after_first_turnover_mb_per_hour": round(slope, 2) if slope is not None else None,
        "rss_growth_after_first_turnover_mb": round(growth, 1) if growth is not None else None,
        "waits_run_after_first_turnover": ran,
        "rss_growth_per_1000_waits_run_mb": round(growth * 1000 / ran, 2) if growth is not None and ran else None,
        "ssh_connections_opened": sshd.accepted,
        "note": NOTE,
        "synthetic_slurm_calls": calls,
        "samples": samples,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--waits", type=int, default=1000)
    parser.add_argument("--min-job-seconds", type=float, default=120.0)
    parser.add_argument("--max-job-seconds", type=float, default=360.0)
    parser.add_argument("--sample-seconds", type=float, default=30.0)
    parser.add_argument("--wait", type=Path, help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.wait:
        spec = json.loads((args.wait / "spec.json").read_text())
        (args.wait / "result.json").write_text(json.dumps(asyncio.run(soak(spec))))
        return 0
    result = run(args)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
