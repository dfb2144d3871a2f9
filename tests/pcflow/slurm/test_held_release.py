"""The train wait releases its own job when Slurm holds it after a failed launch (issue 28.1, the slurmctld fault
of docs/reliability.md): SIGKILLed as the job started, slurmctld recovered a state saved before the start, found
the job already on node1 (drained, "Duplicate jobid") and requeued it held, "launch failed requeued held". Before,
the run waited until a person ran `scontrol release`.

The lines below are Slurm 22.05.8's, printed by the local stack (PCFLOW_FIRST_JOB_ID=11001) on 2026-12-05 07:54 UTC
during `include/local/chaos.py --faults slurmctld` (job 11002 held, 11001 an earlier run's, completed), with the
commands pcflow's queries send (states.SQUEUE_FORMAT; `scontrol show job -o`). The decisions are table-driven on
them; the release itself runs against the real Slurm of the local stack, on a job held by hand (a hold after a
failed launch needs slurmctld killed mid-start: make chaos does that), the squeue answer being the captured one
with that job's id."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import time
import uuid

import pytest
from stacktools import LocalStack

from pcflow.jobstates import JobInfo, JobState, parse_scontrol, parse_squeue
from pcflow.slurm import session
from pcflow.slurm.head_node import HeadNode
from pcflow.slurm.outcomes import Outcome
from pcflow.slurm.session import View
from pcflow.slurm.trigger import SlurmJobTrigger
from pcflow.slurm.watch import JobWatch, Verdict, WatchPolicy, held_after_failed_launch

SQUEUE_HELD = (
    "11002|PENDING|launch failed requeued held|1|pretrain-manual-20261205t075243-9ed91822.train|0:00||pcflow-job-6|"
)
SQUEUE_COMPLETED = "11001|COMPLETED|None|0|pretrain-manual-20261205t074753-8b628684.train|0:29|node[1-2]|pcflow-job-7|"
SCONTROL_HELD = (
    "JobId=11002 JobName=pretrain-manual-20261205t075243-9ed91822.train UserId=pcflow-job-6(2956) "
    "GroupId=pcflow-job-6(2956) MCS_label=N/A Priority=0 Nice=0 Account=(null) QOS=normal JobState=PENDING "
    "Reason=launch_failed_requeued_held Dependency=(null) Requeue=1 Restarts=1 BatchFlag=1 Reboot=0 ExitCode=0:0 "
    "RunTime=00:00:00 TimeLimit=00:30:00 TimeMin=N/A SubmitTime=2026-12-05T07:53:58 EligibleTime=2026-12-05T07:55:59 "
    "AccrueTime=2026-12-05T07:55:59 StartTime=2026-12-05T07:55:59 EndTime=2026-12-05T08:25:59 Deadline=N/A "
    "SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-05T07:53:58 Scheduler=Main Partition=compute "
    "AllocNode:Sid=localhost:14063 ReqNodeList=(null) ExcNodeList=(null) NodeList= NumNodes=2 NumCPUs=2 NumTasks=2 "
    "CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=2,mem=47186M,node=2,billing=2 Socks/Node=* NtasksPerN:B:S:C=1:0:*:* "
    "CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK "
    "Contiguous=0 Licenses=(null) Network=(null) "
    "Command=/work/stacks/ctld/shared/pcflow/runs/pretrain-manual-20261205t075243-9ed91822/train/job.sbatch "
    "WorkDir=/work/stacks/ctld/shared/pcflow/runs/pretrain-manual-20261205t075243-9ed91822/train Power="
)


def squeue_held(job_id: str = "11002", restarts: int = 1) -> JobInfo:
    """The captured hold, for `job_id` and with `restarts` (as Slurm shows it after each requeue)."""
    (info,) = parse_squeue(SQUEUE_HELD)
    return dataclasses.replace(info, job_id=job_id, restarts=restarts)


@pytest.mark.parametrize(
    ("case", "info", "job_id", "held"),
    [
        ("own job, squeue", parse_squeue(SQUEUE_HELD)[0], "11002", True),
        ("own job, scontrol (underscores)", parse_scontrol(SCONTROL_HELD), "11002", True),
        ("another wait's job held so", parse_squeue(SQUEUE_HELD)[0], "11001", False),
        ("own job, completed", parse_squeue(SQUEUE_COMPLETED)[0], "11001", False),
        ("own job, held by its user", dataclasses.replace(squeue_held(), reason="JobHeldUser"), "11002", False),
        ("own job, running again", dataclasses.replace(squeue_held(), state=JobState.RUNNING), "11002", False),
        ("Slurm forgot it", None, "11002", False),
    ],
)
def test_held_after_failed_launch_recognises_only_the_waits_own_job(case, info, job_id, held):
    assert held_after_failed_launch(info, job_id) is held, case


def test_a_release_is_due_once_per_hold_and_within_max_restarts():
    """max_restarts=2: the first hold (Slurm's restart 1) and a second (restart 2) are released; a stale answer
    showing a hold already released is not released again; a third hold would be restart 3: cancelled."""
    watch = JobWatch("11002", WatchPolicy(max_restarts=2))
    held = squeue_held(restarts=1)
    assert watch.assess(held, None, 0) is None and watch.release_due(held)
    watch.released(held)
    assert watch.assess(held, None, 1) is None and not watch.release_due(held)  # the answer before the release
    assert watch.assess(dataclasses.replace(held, state=JobState.RUNNING, reason=""), None, 2) is None
    again = squeue_held(restarts=2)
    assert watch.assess(again, None, 3) is None and watch.release_due(again)
    watch.released(again)
    third = squeue_held(restarts=3)
    verdict = watch.assess(third, None, 4)
    assert not watch.release_due(third)
    assert verdict.outcome is Outcome.TOO_MANY_RESTARTS and verdict.outcome.needs_cancel
    assert watch.held_releases == 2


def test_releases_count_even_where_slurm_would_not():
    """A Slurm that showed no restart for the hold: the wait's own count keeps the bound (max_restarts=1)."""
    watch = JobWatch("11002", WatchPolicy(max_restarts=1))
    first = squeue_held(restarts=0)
    assert watch.release_due(first)
    watch.released(first)
    watch.assess(dataclasses.replace(first, state=JobState.RUNNING, reason=""), None, 1)
    verdict = watch.assess(first, None, 2)
    assert verdict is not None and verdict.outcome is Outcome.TOO_MANY_RESTARTS, verdict
    assert "max_restarts=1" in verdict.message and not watch.release_due(first)


def test_no_release_at_max_restarts_zero():
    watch = JobWatch("11002", WatchPolicy(max_restarts=0))
    verdict = watch.assess(squeue_held(), None, 0)
    assert verdict.outcome is Outcome.TOO_MANY_RESTARTS and not watch.release_due(squeue_held())


# -- the release, on the real Slurm of the local stack -----------------------------------------------------


def slurm(stack: LocalStack, *argv: str) -> str:
    """A Slurm command on the stack (its SLURM_CONF is in os.environ, from the local_stack fixture)."""
    return subprocess.run(list(argv), capture_output=True, text=True, check=True).stdout


def submit_held(stack: LocalStack) -> str:
    """A held job (as the SSH user, root: an administrator's hold) that does nothing once released."""
    name = f"held-{uuid.uuid4().hex[:8]}"
    argv = ["sbatch", "--parsable", "--hold", f"--job-name={name}", "--chdir=/tmp", "--output=/dev/null"]
    return slurm(stack, *argv, "--wrap", "true").strip().split(";")[0]


def held(stack: LocalStack, job_id: str) -> bool:
    """Whether Slurm holds the job now (its priority 0: squeue's %p)."""
    state, _, priority = slurm(stack, "squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T|%p").strip().partition("|")
    return state == "PENDING" and float(priority) == 0


def polls(trigger: SlurmJobTrigger, answer: JobInfo, count: int) -> list[dict | None]:
    """`count` polls of the trigger, each with Slurm's answer `answer`, in the head node's shared session."""

    async def scenario() -> list[dict | None]:
        async with session.joined(trigger) as seat:
            await seat.next_view()  # the session has connected
            return [
                await trigger.poll(seat, View(time.monotonic(), {}, {trigger.job_id: [answer]}, 0))
                for _ in range(count)
            ]

    return asyncio.run(scenario())


def held_trigger(stack: LocalStack, job_id: str, job_user: str | None = None) -> SlurmJobTrigger:
    head_node = HeadNode("slurm_default").running_jobs_as(job_user)
    return SlurmJobTrigger(job_id=job_id, run_dir=str(stack.shared_root / "held"), head_node=head_node.as_dict())


@pytest.mark.stack
def test_the_wait_releases_its_own_held_job(local_stack, capsys):
    job_id = submit_held(local_stack)
    assert held(local_stack, job_id)
    try:
        trigger = held_trigger(local_stack, job_id)
        assert polls(trigger, squeue_held(job_id), 2) == [None, None]  # the second: an answer from before it
        assert not held(local_stack, job_id)
        assert trigger.watch.held_releases == 1
        assert trigger.payload(Verdict(Outcome.SUCCESS, "ended"), None)["held_releases"] == 1  # the result says so
        assert capsys.readouterr().out.count(f"Slurm job {job_id} was held after a failed launch") == 1
    finally:
        slurm(local_stack, "scancel", job_id)


@pytest.mark.stack
def test_a_refused_release_is_logged_once_and_counts_nothing(local_stack, capsys):
    """The job is held by an administrator (root); the wait runs as a job account, which may not release it."""
    job_id = submit_held(local_stack)
    assert held(local_stack, job_id)
    try:
        trigger = held_trigger(local_stack, job_id, job_user="pcflow-job-1")
        assert polls(trigger, squeue_held(job_id), 3) == [None, None, None]
        assert held(local_stack, job_id)
        assert trigger.watch.held_releases == 0
        out = capsys.readouterr().out
        assert out.count(f"Slurm job {job_id} is held after a failed launch and `scontrol release` was refused") == 1
    finally:
        slurm(local_stack, "scancel", job_id)
