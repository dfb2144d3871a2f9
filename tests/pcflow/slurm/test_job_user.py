"""On a shared cluster another user can submit a job under a run's (predictable) name before pcflow
does: pcflow adopts only jobs of its own SSH user. The second Slurm user is a real Linux user of this
host, submitting through the same munge and slurmctld (so Slurm records who submitted what)."""

from __future__ import annotations

import importlib
import os
import pwd
import subprocess

import pytest
from airflow.sdk.exceptions import TaskDeferred
from stacktools import LocalStack
from taskcontext import first_event, make_context

from pcflow.jobstates import JobInfo, JobState, parse_sacct, parse_squeue
from pcflow.slurm.operators import SlurmJobOperator

pytestmark = pytest.mark.security

OTHER_USER = "pcflow-other"
FAST = {"poll_interval": 0.2, "confirm_interval": 2.0}


@pytest.fixture(scope="module")
def other_user() -> str:
    """A second local user (created when missing, removed again if this fixture created it)."""
    try:
        pwd.getpwnam(OTHER_USER)
        created = False
    except KeyError:
        argv = ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER_USER]
        subprocess.run(argv, check=True, capture_output=True)
        created = True
    yield OTHER_USER
    if created:
        subprocess.run(["userdel", OTHER_USER], check=False, capture_output=True)


def submit_as(user: str, stack: LocalStack, job_name: str) -> str:
    """sbatch as `user`: a held job (it never runs) named `job_name`."""
    argv = [
        "runuser",
        "-u",
        user,
        "--",
        "env",
        f"SLURM_CONF={stack.env['SLURM_CONF']}",
        "sbatch",
        "--parsable",
        "--hold",
        f"--job-name={job_name}",
        "--chdir=/tmp",
        "--output=/dev/null",
        "--wrap",
        "sleep 60",
    ]
    out = subprocess.run(argv, check=True, capture_output=True, text=True, timeout=60)
    return out.stdout.strip().split(";")[0]


def test_squeue_and_sacct_lines_carry_the_user():
    (live,) = parse_squeue("42|PENDING|JobHeldUser|0|k.train|0:00|(null)|mallory|\n")
    (past,) = parse_sacct("7|k.train|COMPLETED|0:0|95|n2|None|mallory\n")
    assert live.user == past.user == "mallory"
    assert JobInfo.from_dict(live.as_dict()) == live and JobInfo("1", JobState.RUNNING).user == ""


@pytest.mark.stack
def test_a_job_another_user_named_after_the_run_is_not_adopted(local_stack: LocalStack, other_user: str, capsys):
    """About 10 s: the other user's held job, then pcflow's own job run to completion."""
    op = SlurmJobOperator(task_id="train", program=["bash", "-c", "echo ours"], **FAST)
    context = make_context("train")
    planted = submit_as(other_user, local_stack, op.job_name(context))
    try:
        assert [(j.job_id, j.user) for j in op.hook.find_jobs(op.job_name(context))] == [(planted, other_user)]
        with pytest.raises(TaskDeferred) as deferred:
            op.execute(context)
        classpath, kwargs = deferred.value.trigger.serialize()
        assert kwargs["job_id"] != planted
        module, _, name = classpath.rpartition(".")
        result = op.execute_complete(context, first_event(getattr(importlib.import_module(module), name)(**kwargs)))
        assert result["job_id"] == kwargs["job_id"] and result["state"] == "COMPLETED"
        out = capsys.readouterr().out
        assert f"Not adopting Slurm job {planted}" in out and repr(other_user) in out

        # A retry with no saved state finds the run's job by name: ours, never the planted one.
        again = SlurmJobOperator(task_id="train", program=["bash", "-c", "echo ours"], **FAST)
        assert again.execute(make_context("train", run_id=context["run_id"]))["job_id"] == result["job_id"]
    finally:
        subprocess.run(["scancel", planted], env={**os.environ, **local_stack.env}, check=False)
