"""`make demo`: the `pretrain` DAG end to end on the embedded default, then what it did.

Trains the SimCLR payload on the digits through every stage (network, dataset, image, cluster,
Slurm job, metrics, teardown) against the local stack, and prints a summary. Exits non-zero if the
run failed or left anything tagged with its run key behind. `rehearsal.py` runs the same with the
`aws-gpu` rehearsal profile and adds what that profile does differently.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dagrun import REPO, DagRunResult, airflow_environment, prepare_airflow, run_dag, tagged_resources
from progress import task_lines

CONF = {"partition": "demo", "hyperparameters": {"epochs": 5}}
UNTRAINED = "_untrained"


def trained_vs_untrained(metrics: dict) -> dict[str, dict[str, float | None]]:
    """Each evaluation the payload ran on both encoders (`<name>` and `<name>_untrained`), side by side."""
    final = {name: m.get("final") for name, m in (metrics.get("metrics") or {}).items()}
    pairs = [name.removesuffix(UNTRAINED) for name in final if name.endswith(UNTRAINED)]
    return {name: {"trained": final.get(name), "untrained": final[name + UNTRAINED]} for name in pairs}


def prepare() -> None:
    """This process as a worker of the stack's own Airflow home (SQLite), pools included."""
    airflow_home = Path(os.environ.get("PCFLOW_AIRFLOW_HOME", REPO / ".stack" / "airflow"))
    os.environ.update(airflow_environment(airflow_home))
    os.environ.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "WARNING")
    sys.path.insert(0, str(REPO / "plugins"))
    prepare_airflow(airflow_home)


def run_with_progress(
    name: str, dag_id: str, conf: dict[str, Any], summarize_run: Callable[[DagRunResult, float], dict[str, Any]]
) -> dict[str, Any]:
    """Run the DAG with one line per task on the terminal, and summarize it; Airflow's own output (and
    the summary's AWS lookups') goes to a log file, which the summary names."""
    when = dt.datetime.now(dt.UTC).replace(microsecond=0)
    log = Path(os.environ.get("PCFLOW_STACK_DIR", REPO / ".stack")) / "logs" / f"{name}-{when:%Y%m%dT%H%M%SZ}.log"
    started = time.monotonic()
    with task_lines(dag_id, when, log):
        result = run_dag(dag_id, conf, run_after=when)
        summary = summarize_run(result, time.monotonic() - started)
    return {**summary, "airflow_log": str(log)}


def run_outcome(result: DagRunResult, seconds: float) -> dict[str, Any]:
    """How a DAG run ended (ids, state, wall time, the tasks that did not succeed): what every summary of
    `make demo` and `make example` starts with."""
    return {
        "dag_run": result.run_id,
        "state": result.state,
        "seconds": round(seconds, 1),
        "run_key": result.run_key,
        "failed_tasks": sorted(t for t, s in result.task_states.items() if s not in ("success", "skipped")),
    }


def left_tagged(result: DagRunResult) -> list[str]:
    """What is still tagged with the run's key in the emulator: nothing, after a run that tore down."""
    return tagged_resources("pcflow:run", result.run_key) if result.run_key else ["(no run key)"]


def summarize(result: DagRunResult, seconds: float) -> dict[str, Any]:
    """What the run did, from what its tasks returned, and what is still tagged with its run key."""
    out = result.returned
    metrics = out.get("metrics") or {}
    deleted = [*(out.get("teardown") or {}).get("deleted", []), *(out.get("release_network") or {}).get("deleted", [])]
    return {
        **run_outcome(result, seconds),
        "network": {k: (out.get("network") or {}).get(k) for k in ("vpc_id", "head_subnet_id")},
        "image": out.get("image"),
        "dataset": {k: (out.get("dataset") or {}).get(k) for k in ("uri", "object_count", "uploaded", "skipped")},
        "payload": {k: (out.get("ship_payload") or {}).get(k) for k in ("dir", "reused")},
        "slurm_job": {k: (out.get("train") or {}).get(k) for k in ("job_id", "state", "nodes", "elapsed_s", "run_dir")},
        "objective": metrics.get("objective"),
        "trained_vs_untrained": trained_vs_untrained(metrics),
        "cost_usd": {**cost_before(out.get("validate")), "final_estimate": metrics.get("cost_usd_estimate")},
        "report": metrics.get("report"),
        "model": (metrics.get("model") or {}).get("model"),
        "teardown_deleted": [f"{d['kind']} {d['id']}" for d in deleted],  # the run's, then the network's last user
        "left_tagged_with_run_key": left_tagged(result),
    }


def report(name: str, summary: dict[str, Any]) -> int:
    """Print the summary and a one-line verdict; 0 when the run succeeded and left nothing tagged."""
    print(json.dumps(summary, indent=2, default=str))
    objective = summary.get("objective") or {}
    versus = summary["trained_vs_untrained"].get(objective.get("name"), {})
    left = summary["left_tagged_with_run_key"]
    iam = summary.get("iam")  # the rehearsal's: its AWS calls against the shipped IAM policies
    if iam is not None:
        print(f"iam: {json.dumps({k: iam[k] for k in ('calls', 'denied')})}")
        print("".join(f"  denied: {denial}\n" for denial in iam.get("denials", [])), end="")
    ok = summary["state"] == "success" and not left and (iam is None or (iam["calls"] and not iam["denied"]))
    print(
        f"pcflow {name}: {'OK' if ok else 'FAILED'} - run {summary['state']}, {objective.get('name')} "
        f"{versus.get('trained')} trained vs {versus.get('untrained')} untrained, "
        f"{len(summary['teardown_deleted'])} resources deleted, {len(left)} left, {summary['seconds']} s",
        flush=True,
    )
    return 0 if ok else 1


def cost_before(run: dict | None) -> dict:
    """What the first task said the run may cost, and its budget."""
    cost = (run or {}).get("cost") or {}
    return {"maximum_before": cost.get("maximum_usd"), "budget": cost.get("budget_usd")}


def main() -> int:
    prepare()
    print("pcflow demo: running DAG `pretrain` on the local profile (moto + local Slurm) ...", flush=True)
    return report("demo", run_with_progress("demo", "pretrain", CONF, summarize))


if __name__ == "__main__":
    sys.exit(main())
