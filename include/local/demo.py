"""`make demo`: the `pretrain` DAG end to end on the embedded default, then what it did.

Trains the SimCLR payload on the digits through every stage (network, dataset, image, cluster,
Slurm job, metrics, teardown) against the local stack, and prints a summary. Exits non-zero if the
run failed or left anything tagged with its run key behind.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from dagrun import REPO, airflow_environment, prepare_airflow, run_dag, tagged_resources

CONF = {"partition": "demo", "hyperparameters": {"epochs": 5}}
UNTRAINED = "_untrained"


def trained_vs_untrained(metrics: dict) -> dict[str, dict[str, float | None]]:
    """Each evaluation the payload ran on both encoders (`<name>` and `<name>_untrained`), side by side."""
    final = {name: m.get("final") for name, m in (metrics.get("metrics") or {}).items()}
    pairs = [name.removesuffix(UNTRAINED) for name in final if name.endswith(UNTRAINED)]
    return {name: {"trained": final.get(name), "untrained": final[name + UNTRAINED]} for name in pairs}


def main() -> int:
    airflow_home = Path(os.environ.get("PCFLOW_AIRFLOW_HOME", REPO / ".stack" / "airflow"))
    os.environ.update(airflow_environment(airflow_home))
    os.environ.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "WARNING")
    sys.path.insert(0, str(REPO / "plugins"))
    prepare_airflow(airflow_home)

    print("pcflow demo: running DAG `pretrain` on the local profile (moto + local Slurm) ...", flush=True)
    started = time.monotonic()
    result = run_dag("pretrain", CONF)
    out = result.returned
    metrics = out.get("metrics") or {}
    teardown = out.get("teardown") or {}
    leftover = tagged_resources("pcflow:run", result.run_key) if result.run_key else ["(no run key)"]
    summary = {
        "dag_run": result.run_id,
        "state": result.state,
        "seconds": round(time.monotonic() - started, 1),
        "run_key": result.run_key,
        "failed_tasks": sorted(t for t, s in result.task_states.items() if s not in ("success", "skipped")),
        "network": {k: (out.get("network") or {}).get(k) for k in ("vpc_id", "head_subnet_id")},
        "image": out.get("image"),
        "dataset": {k: (out.get("dataset") or {}).get(k) for k in ("uri", "object_count", "uploaded", "skipped")},
        "payload": {k: (out.get("ship_payload") or {}).get(k) for k in ("dir", "reused")},
        "slurm_job": {k: (out.get("train") or {}).get(k) for k in ("job_id", "state", "nodes", "elapsed_s", "run_dir")},
        "objective": metrics.get("objective"),
        "trained_vs_untrained": trained_vs_untrained(metrics),
        "cost_usd_estimate": metrics.get("cost_usd_estimate"),
        "report": metrics.get("report"),
        "model": (metrics.get("model") or {}).get("model"),
        "teardown_deleted": [f"{d['kind']} {d['id']}" for d in teardown.get("deleted", [])],
        "left_tagged_with_run_key": leftover,
    }
    print(json.dumps(summary, indent=2, default=str))
    objective = metrics.get("objective") or {}
    versus = summary["trained_vs_untrained"].get(objective.get("name"), {})
    ok = result.state == "success" and not leftover
    print(
        f"pcflow demo: {'OK' if ok else 'FAILED'} - run {result.state}, {objective.get('name')} "
        f"{versus.get('trained')} trained vs {versus.get('untrained')} untrained, "
        f"{len(summary['teardown_deleted'])} resources deleted, {len(leftover)} left, {summary['seconds']} s",
        flush=True,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
