"""A worker crash in the middle of training, at DAG level: the process running `pretrain` is killed
(SIGKILL) while its Slurm job runs; the train task of the same DAG run is then retried and adopts the
job instead of submitting another, and the run ends as if nothing happened, leaving nothing behind."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dagrun import REPO, remove_stack, resume_dag_run, tagged_resources

from pcflow.naming import run_key

pytestmark = pytest.mark.stack
CONF = {"partition": "crash", "tasks_per_node": 1, "hyperparameters": {"epochs": 2}}
RUN = """
import datetime as dt, json, sys
sys.path.insert(0, {local!r})
from dagrun import run_dag
when = dt.datetime.fromisoformat(sys.argv[1])
run_dag("pretrain", json.loads(sys.argv[2]), logical_date=when, run_after=when)
"""


def slurm(*argv: str) -> list[str]:
    out = subprocess.run(argv, capture_output=True, text=True, check=True, env=os.environ)
    return [line for line in out.stdout.splitlines() if line.strip()]


def wait_until_running(job_name: str, proc: subprocess.Popen, log: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:]
            pytest.fail(f"the DAG run ended (exit {proc.returncode}) before its Slurm job ran:\n{tail}")
        if "RUNNING" in slurm("squeue", "-h", "-n", job_name, "-o", "%T"):
            return
        time.sleep(0.5)
    pytest.fail(f"Slurm job {job_name} was not running after {timeout} s")


def test_train_task_killed_mid_job_is_retried_and_adopts_the_job(airflow, tmp_path):
    when = dt.datetime.now(dt.UTC).replace(microsecond=0)
    run_id = f"manual__{when.isoformat()}"
    job_name = f"{run_key('pretrain', run_id)}.train"
    code = RUN.format(local=str(REPO / "include" / "local"))
    log = tmp_path / "killed-run.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, when.isoformat(), json.dumps(CONF)], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        wait_until_running(job_name, proc, log)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)  # the worker (and the in-process triggerer) die mid-task
        proc.wait()
    try:
        result = resume_dag_run("pretrain", run_id, retry=["train"])
        assert result.run_key == run_key("pretrain", run_id)
        assert result.state == "success", result.task_states
        assert result.returned["train"]["state"] == "COMPLETED"
        jobs = slurm("sacct", "-n", "-X", "-S", "now-1hours", "--name", job_name, "-o", "JobID,State")
        assert len(jobs) == 1, jobs  # adopted, not submitted again
        assert result.returned["train"]["job_id"] == jobs[0].split()[0]
        assert tagged_resources("pcflow:run", result.run_key) == []
    finally:
        assert remove_stack("local") == []  # what the run keeps on purpose (image, data bucket)
