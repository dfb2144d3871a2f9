"""A worker crash in the middle of training, at DAG level: the process running `pretrain` is killed
(SIGKILL) while its Slurm job runs; the train task of the same DAG run is then retried and adopts the
job instead of submitting another, and the run ends as if nothing happened, leaving nothing behind."""

from __future__ import annotations

import pytest
from dagprocess import kill_when, manual_run, slurm, spawn
from dagrun import remove_stack, resume_dag_run, tagged_resources

from pcflow.naming import run_key

pytestmark = pytest.mark.stack
CONF = {"partition": "crash", "tasks_per_node": 1, "hyperparameters": {"epochs": 2}}


def test_train_task_killed_mid_job_is_retried_and_adopts_the_job(airflow, tmp_path):
    run_id, when = manual_run("pretrain")
    job_name = f"{run_key('pretrain', run_id)}.train"
    log = tmp_path / "killed-run.log"

    def running() -> bool:
        return "RUNNING" in slurm("squeue", "-h", "-n", job_name, "-o", "%T")

    process = spawn("start", "pretrain", run_id, when, log=log, conf=CONF)
    kill_when(process, running, log, "its Slurm job ran", timeout=300)
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
