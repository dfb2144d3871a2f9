"""Many runs on one stack at once (issue 27): two `pretrain` runs and a 4-trial `pretrain_sweep` on the same
stack, each its own `dag.test` process on the stack's Airflow home, then what they shared and what is left.

All three processes start together and begin their DAG runs seconds apart (each once the previous one's DAG
run exists: the first write of the DAGs to a fresh Airflow database is not safe to race): on a stack with no
network or image yet, one run creates the network and one bakes the image, under the stack's network lock
and the recipe's bake lock (pcflow.aws.locks), while the others wait for each lock in the triggerer and then
adopt what was made; then all three run side by side: network references, clusters (one per run on
ParallelCluster; the local Slurm, one job account each, on `local`), Slurm jobs and teardowns overlap.
The first run trains the profile's epochs, the others one (what they share matters, not their accuracy).
`overlapped` says whether all three held the network at once (every network task began before any run's
`release_network` ended). Prints each run's summary line, then

    concurrent: {"runs": 3, "succeeded": 3, "clusters_created": K, "networks_created": 1}
    images: {"baked": B, "adopted": A}

(B: 1 on a stack with no image of the recipe yet, else 0; a run that waited for the bake lock adopts) and
each run's time to first job (from its DAG run's start to its Slurm job's submission). Exits non-zero unless
every run succeeded, at most one image was baked, and nothing tagged with a run key, nor the stack's
network, is left.

Usage: many_runs.py [PROFILE] (default aws-gpu-rehearsal; `make rehearsal` runs it after the single-run
rehearsal, `make concurrent` with `local`).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dagrun import REPO, DagRunResult, run_dag, tagged_resources
from demo import prepare

#: The runs: (name, DAG, conf beyond the profile). One epoch: the point is what they share, not accuracy.
FAST = {"hyperparameters": {"epochs": 1}}
SEEDS = [{"seed": s} for s in range(4)]
RUNS = (
    ("pretrain-1", "pretrain", {"partition": "concurrent"}),
    ("pretrain-2", "pretrain", {"partition": "concurrent", **FAST}),
    # One node a trial: a trial has whole nodes of its own, and the local stack has three.
    ("sweep", "pretrain_sweep", {"partition": "concurrent", "nodes": 1, "trials": SEEDS, **FAST}),
)


def runs_for(profile: str) -> tuple[tuple[str, str, dict[str, Any]], ...]:
    """RUNS with the sweep given the largest budget `profile` allows (`budget.max_usd`, what a person sweeping
    would ask for): its maximum bills every attempt of every trial, above one run's default budget on aws-gpu."""
    from pcflow.runspec import resolve_run_spec

    most = resolve_run_spec(profile).budget.max_usd
    budget = {"budget_usd": most} if most is not None else {}
    return tuple((name, dag, {**conf, **budget} if dag == "pretrain_sweep" else conf) for name, dag, conf in RUNS)


def child(dag_id: str, run_after: str, conf: str, out: str, after: str = "") -> int:
    """One run to its end in this process, on the Airflow home its parent set up (inherited environment: the
    parent's `prepare()`, or a test's); what it returned goes to `out` as JSON. `after` (`<dag_id>
    <run_after>`): loaded first, the run begins once that DAG run exists (its DAG is in the database)."""
    sys.path.insert(0, str(REPO / "plugins"))  # this checkout's pcflow, as demo.py imports it
    if after:
        import pcflow.pipeline  # noqa: F401 - what the run's DAG file imports, loaded while it waits

        wait_dag, wait_after = after.split()
        wait_for_run(wait_dag, dt.datetime.fromisoformat(wait_after))
    when = dt.datetime.fromisoformat(run_after)  # also its logical date: dag.test clears the runs of its own only
    result = run_dag(dag_id, json.loads(conf), logical_date=when, run_after=when)
    Path(out).write_text(json.dumps(result.__dict__, default=str))
    return 0


def start(
    name: str, dag_id: str, conf: dict[str, Any], when: dt.datetime, logs: Path, *, after: str = ""
) -> tuple[Any, Path]:
    """A run in a process of its own (its Airflow output in a log file), begun once `after` exists (see
    `child`); returns the process and where it answers."""
    out = logs / f"concurrent-{name}-{when:%Y%m%dT%H%M%S}.json"
    log = (logs / f"concurrent-{name}-{when:%Y%m%dT%H%M%S}.log").open("w")
    argv = [sys.executable, __file__, "--child", dag_id, when.isoformat(), json.dumps(conf), str(out), after]
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT), out


def wait_for_run(dag_id: str, run_after: dt.datetime, timeout: float = 600) -> None:
    """Until that DAG run exists in the stack's Airflow database (or `timeout` seconds have passed: the run
    then starts all the same); the run is found by its `run_after` (its id has a random suffix)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with create_session() as session:
            if session.query(DagRun).filter_by(dag_id=dag_id, run_after=run_after).count():
                return
        time.sleep(1)


def time_to_first_job(dag_id: str, run_id: str) -> float | None:
    """Seconds from the DAG run's start to its train task's start (the Slurm job's submission)."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        run = session.query(DagRun).filter_by(dag_id=dag_id, run_id=run_id).one()
        train = session.query(TaskInstance).filter_by(dag_id=dag_id, run_id=run_id, task_id="train").one_or_none()
        if train is None or train.start_date is None or run.start_date is None:
            return None
        return round((train.start_date - run.start_date).total_seconds(), 1)


def stack_network_left(stack: str) -> list[str]:
    """The stack's network resources still there (all runs gave their reference back: none)."""
    from pcflow.aws.clients import DEFAULT_AWS_CONN_ID, aws_client
    from pcflow.aws.teardown import Selector, build_handlers

    def clients(service: str) -> Any:
        return aws_client(service, aws_conn_id=DEFAULT_AWS_CONN_ID)

    selector = Selector(stack=stack, components=frozenset({"network"}))
    return [r.describe() for handler in build_handlers(clients, ["ec2"]) for r in handler.list(selector)]


def summary(results: dict[str, DagRunResult]) -> dict[str, Any]:
    """The concurrent line's counts and each run's own line."""
    runs = {}
    for name, result in results.items():
        out = result.returned
        cluster = out.get("cluster") or {}
        runs[name] = {
            "dag_id": result.dag_id,
            "state": result.state,
            "run_key": result.run_key,
            "time_to_first_job_s": time_to_first_job(result.dag_id, result.run_id),
            "network": {k: (out.get("network") or {}).get(k) for k in ("vpc_id", "created")},
            "image": {k: (out.get("image") or {}).get(k) for k in ("image_id", "reused")},
            "cluster": {k: cluster.get(k) for k in ("provider", "name", "adopted")},
            "job_account": out.get("lease_job_account"),
            "released_network": {k: (out.get("release_network") or {}).get(k) for k in ("network_deleted", "kept")},
            "failed_tasks": sorted(t for t, s in result.task_states.items() if s not in ("success", "skipped")),
            "left_tagged_with_run_key": tagged_resources("pcflow:run", result.run_key) if result.run_key else ["?"],
        }
    made = [r for r in runs.values() if r["cluster"]["provider"] == "parallelcluster" and not r["cluster"]["adopted"]]
    counts = {
        "runs": len(runs),
        "succeeded": sum(r["state"] == "success" for r in runs.values()),
        "clusters_created": len(made),
        "networks_created": sum(bool(r["network"]["created"]) for r in runs.values()),
    }
    baked = sum(r["image"]["image_id"] is not None and r["image"]["reused"] is False for r in runs.values())
    images = {"baked": baked, "adopted": sum(bool(r["image"]["reused"]) for r in runs.values())}
    return {"concurrent": counts, "images": images, "runs": runs}


def run_many(profile: str) -> dict[str, DagRunResult]:
    """The runs of RUNS on `profile`, each in its own process, begun seconds apart (`start_all`)."""
    stack_dir = Path(os.environ.get("PCFLOW_STACK_DIR", REPO / ".stack"))
    logs = stack_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    began = dt.datetime.now(dt.UTC).replace(microsecond=0)
    started = start_all(runs_for(profile), {"profile": profile}, began, logs)
    results = {}
    for name, (process, out) in started.items():
        process.wait()
        if out.exists():
            results[name] = DagRunResult(**json.loads(out.read_text()))
        print(f"  {name}: {results[name].state if name in results else f'no result ({process.returncode})'}")
    return results


def start_all(
    runs: tuple[tuple[str, str, dict[str, Any]], ...], conf: dict[str, Any], began: dt.datetime, logs: Path
) -> dict[str, tuple[Any, Path]]:
    """Each run's process, now; each run begins once the previous one's DAG run exists. `conf` over each run's."""
    started, previous = {}, ""
    for index, (name, dag_id, run_conf) in enumerate(runs):
        when = began + dt.timedelta(seconds=index)  # run ids apart
        started[name] = start(name, dag_id, {**run_conf, **conf}, when, logs, after=previous)
        previous = f"{dag_id} {when.isoformat()}"
        print(f"  started {name} ({dag_id}, run after {when.isoformat()}), log {started[name][1].with_suffix('.log')}")
    return started


def overlapped(results: dict[str, DagRunResult]) -> bool | None:
    """Whether every run's network task began before any run's `release_network` ended: all held the network
    at once. None when a run lacks either task."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        times = {}
        for task_id, column in (("network", "start_date"), ("release_network", "end_date")):
            rows = [
                session.query(TaskInstance).filter_by(dag_id=r.dag_id, run_id=r.run_id, task_id=task_id).one_or_none()
                for r in results.values()
            ]
            times[task_id] = [getattr(row, column, None) for row in rows]
    if None in times["network"] + times["release_network"] or not results:
        return None
    return max(times["network"]) < min(times["release_network"])


def report(results: dict[str, DagRunResult]) -> int:
    """Print each run's line, the times to first job and the concurrent line; 0 when every run succeeded
    and nothing of theirs (nor the stack's network) is left."""
    summary_ = summary(results)
    stack = next(iter((r.returned.get("validate") or {}).get("stack") for r in results.values()), None)
    network_left = stack_network_left(stack) if stack else ["(no run ended)"]
    print(json.dumps(summary_["runs"], indent=2, default=str))
    for name, run in summary_["runs"].items():
        print(f"time to first job: {name} {run['time_to_first_job_s']} s")
    print(f"concurrent: {json.dumps(summary_['concurrent'])}")
    print(f"images: {json.dumps(summary_['images'])} (one bake of the recipe at most: the bake lock)")
    print(f"overlapped: {overlapped(results)} (every run held the stack's network at the same time)")
    left = network_left + [x for r in summary_["runs"].values() for x in r["left_tagged_with_run_key"]]
    ok = summary_["concurrent"]["succeeded"] == len(RUNS) and summary_["images"]["baked"] <= 1 and not left
    print(f"pcflow concurrent: {'OK' if ok else 'FAILED'} - {len(left)} left {left}", flush=True)
    return 0 if ok else 1


def main(profile: str) -> int:
    prepare()
    print(f"pcflow concurrent: 2 x pretrain + a 4-trial sweep at once on one stack, profile {profile} ...", flush=True)
    return report(run_many(profile))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        sys.exit(child(*sys.argv[2:7]))
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "aws-gpu-rehearsal"))
