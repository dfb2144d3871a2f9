"""How long each DAG file takes to parse, in a fresh interpreter as the dag-processor sees it, net of
importing `airflow.sdk` itself; against a one-task DAG (the floor any DAG file pays) in the same run.

Two ways: with bytecode cached (the steady state of a dag-processor, which re-parses every file every
few minutes: Python compiled the modules on the first parse), and compiling every module from source
(`PYTHONDONTWRITEBYTECODE=1`, the first parse after a deploy). The goal is judged on the first. Also
listed per file: the heavy packages that parsing loaded beyond what `airflow.sdk` had (none expected:
operators import their hooks, clients and triggers when they run).

Usage: .venv/bin/python benchmarks/dag_parse.py [--repeat 5]; prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "dag_parse.json"
GOAL_MS = 200
#: Packages a DAG file must not load when it is parsed (Airflow's `airflow.sdk` loads none of them).
HEAVY = (
    *("boto3", "botocore", "s3transfer", "aiobotocore", "paramiko", "asyncssh"),
    *("airflow.providers.amazon.aws.hooks", "airflow.providers.amazon.aws.triggers", "airflow.providers.ssh.hooks"),
    *("pcflow.runspec", "pcflow.slurm.spec", "pcflow.cluster.spec", "pcflow.aws.network_spec", "pcflow.capacity"),
)
PEER = """
from airflow.sdk import DAG
from airflow.providers.standard.operators.empty import EmptyOperator

with DAG(dag_id="one_task", schedule=None):
    EmptyOperator(task_id="noop")
"""
PROBE = """
import sys, time, runpy
sys.path.insert(0, {plugins!r})
t0 = time.perf_counter()
import airflow.sdk
t1 = time.perf_counter()
before = set(sys.modules)
runpy.run_path({path!r})
t2 = time.perf_counter()
new = set(sys.modules) - before
hits = [h for h in {heavy!r} if any(m == h or m.startswith(h + ".") for m in new)]
print((t1 - t0) * 1000, (t2 - t1) * 1000, ",".join(hits) or "-")
"""


def parse_ms(path: Path, repeat: int, *, cached: bool, pycache: str) -> dict[str, Any]:
    """Median over `repeat` fresh processes: `airflow.sdk` import, and the DAG file on top of it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AIRFLOW_CONN_", "PYTHON"))}
    env.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="pcflow-parse-"))
    if cached:
        env["PYTHONPYCACHEPREFIX"] = pycache  # private: the repository and the venv stay untouched
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    code = PROBE.format(plugins=str(REPO / "plugins"), path=str(path), heavy=HEAVY)
    baseline, parse, heavy = [], [], "-"
    for attempt in range(repeat + int(cached)):
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        sdk_ms, dag_ms, heavy = out.stdout.split()[-3:]
        if cached and attempt == 0:
            continue  # the warm-up that compiles and caches the bytecode
        baseline.append(float(sdk_ms))
        parse.append(float(dag_ms))
    return {
        "sdk_import_ms": round(statistics.median(baseline), 1),
        "parse_ms": round(statistics.median(parse), 1),
        "heavy": [] if heavy == "-" else heavy.split(","),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    files = sorted((REPO / "dags").glob("*.py"))
    with tempfile.TemporaryDirectory() as tmp:
        peer_file = Path(tmp) / "one_task.py"
        peer_file.write_text(PEER)
        pycache = str(Path(tmp) / "pycache")
        cached = {p.name: parse_ms(p, args.repeat, cached=True, pycache=pycache) for p in files}
        compiling = {p.name: parse_ms(p, args.repeat, cached=False, pycache=pycache) for p in files}
        peer = parse_ms(peer_file, args.repeat, cached=True, pycache=pycache)
        peer_compiling = parse_ms(peer_file, args.repeat, cached=False, pycache=pycache)
    worst = max(v["parse_ms"] for v in cached.values())
    result = {
        "benchmark": "dag_parse",
        "metrics": {
            "per_file_ms_net_of_airflow_sdk": {k: v["parse_ms"] for k, v in cached.items()},
            "per_file_ms_compiling_from_source": {k: v["parse_ms"] for k, v in compiling.items()},
            "heavy_packages_loaded": {k: v["heavy"] for k, v in cached.items()},
            "airflow_sdk_import_ms": statistics.median(v["sdk_import_ms"] for v in cached.values()),
            "worst_ms": worst,
            "repeat": args.repeat,
            "load_average_1m": round(os.getloadavg()[0], 2),
        },
        "peers": {
            "one-task DAG (EmptyOperator)": {
                "parse_ms": peer["parse_ms"],
                "parse_ms_compiling_from_source": peer_compiling["parse_ms"],
            }
        },
        "goal": f"every DAG file parses in under {GOAL_MS} ms beyond importing airflow.sdk (bytecode cached)",
        "goal_met": worst < GOAL_MS and not any(v["heavy"] for v in cached.values()),
    }
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
