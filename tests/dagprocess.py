"""A DAG run in a process of its own, to be killed as a worker dies (SIGKILL: the in-process triggerer
dies with it) and carried on: the crash tests' shared tooling (include/local/dagrun.py runs the DAG)."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dagrun import REPO

SCRIPT = """
import datetime as dt, json, sys
sys.path[:0] = [{local!r}, {plugins!r}]  # this checkout's pcflow, as pytest and demo.py import it
from dagrun import resume_dag_run, run_dag, unfinished_tasks
action, dag_id, run_id, when, conf = sys.argv[1:6]
when = dt.datetime.fromisoformat(when)
if action == "start":
    run_dag(dag_id, json.loads(conf), logical_date=when, run_after=when)
else:
    resume_dag_run(dag_id, run_id, retry=unfinished_tasks(dag_id, run_id))
"""


def manual_run(dag_id: str) -> tuple[str, dt.datetime]:
    """The run id a run started now gets (`manual__<run_after>`), and that time."""
    when = dt.datetime.now(dt.UTC).replace(microsecond=0)
    return f"manual__{when.isoformat()}", when


def spawn(action: str, dag_id: str, run_id: str, when: dt.datetime, *, log: Path, conf: dict | None = None):
    """`start` the run, or `resume` it (its unfinished tasks retried), in a child process logging to `log`."""
    code = SCRIPT.format(local=str(REPO / "include" / "local"), plugins=str(REPO / "plugins"))
    argv = [sys.executable, "-c", code, action, dag_id, run_id, when.isoformat(), json.dumps(conf or {})]
    with log.open("ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)


def kill_when(proc: subprocess.Popen, ready: Callable[[], Any], log: Path, what: str, timeout: float = 600) -> Any:
    """SIGKILL the process as soon as `ready()` answers something true; returns that answer."""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = log.read_text(errors="replace")[-3000:]
                pytest.fail(f"the DAG run ended (exit {proc.returncode}) before {what}:\n{tail}")
            answer = ready()
            if answer:
                return answer
            time.sleep(0.5)
        pytest.fail(f"no {what} after {timeout} s")
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def slurm(*argv: str) -> list[str]:
    out = subprocess.run(argv, capture_output=True, text=True, check=True, env=os.environ)
    return [line for line in out.stdout.splitlines() if line.strip()]
