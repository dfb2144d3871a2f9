"""Issue 28, point 2, in the triggerer: Airflow cancels a trigger "as a user's action", and calls its
`on_kill`, both when a person stopped the deferred task and when the trigger moved to another triggerer
(this one's heartbeat was late). Only the first cancels the job: the trigger asks Airflow through the
triggerer's supervisor channel (a fake one here, installed where the triggerer installs its own)."""

from __future__ import annotations

import asyncio
import time

import pytest
from airflow.sdk.execution_time import task_runner
from airflow.sdk.execution_time.comms import GetTaskStates
from taskcontext import FakeTI, deferred_trigger, make_context, supervisor_comms

from pcflow.jobstates import JobState
from pcflow.slurm import kills
from pcflow.slurm.hook import SlurmHook
from pcflow.slurm.kills import KillVerdict
from pcflow.slurm.operators import SlurmJobOperator

FAST = {"poll_interval": 0.2, "confirm_interval": 2.0}
A_PERSON = pytest.mark.parametrize(
    "airflow_says", ["failed", "success", None], ids=["marked-failed", "marked-success", "cleared"]
)


@pytest.fixture(autouse=True)
def no_early_question(monkeypatch):
    """Each test starts in a process that has asked nothing yet."""
    monkeypatch.setattr(kills, "_EARLY", {})


def train(state: str | None) -> FakeTI:
    return FakeTI(dag_id="pretrain", run_id="manual__2026-12-05", task_id="train", state=state)


@A_PERSON
def test_a_person_s_action_is_the_person_s(monkeypatch, airflow_says):
    ti = train(airflow_says)
    comms = supervisor_comms(monkeypatch, ti)
    assert asyncio.run(kills.trigger_kill_verdict(ti)) == KillVerdict(True, airflow_says or "none")
    assert comms.asked == [
        GetTaskStates(dag_id="pretrain", task_ids=["train"], run_ids=["manual__2026-12-05"], map_index=-1)
    ]


def test_still_deferred_is_the_orchestrator_moving_the_wait(monkeypatch):
    ti = train("deferred")
    supervisor_comms(monkeypatch, ti)
    assert asyncio.run(kills.trigger_kill_verdict(ti)) == KillVerdict(False, "deferred")


def test_no_answer_within_the_timeout_is_not_a_person(monkeypatch):
    ti = train("failed")
    comms = supervisor_comms(monkeypatch, ti, silent=True)
    verdict = asyncio.run(kills.trigger_kill_verdict(ti, timeout=0.5))
    assert not verdict.by_person and len(comms.asked) == 1
    assert verdict.said.startswith("no answer from Airflow (TimeoutError: Airflow gave no answer within")


def test_no_supervisor_channel_is_not_a_person(monkeypatch):
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", None, raising=False)
    verdict = asyncio.run(kills.trigger_kill_verdict(train("failed")))
    assert not verdict.by_person and "no supervisor channel" in verdict.said


def test_a_mapped_task_instance_is_read_under_its_index():
    ti = FakeTI(dag_id="sweep", run_id="r", task_id="trial", map_index=3)
    assert kills.state_in({"r": {"trial": "deferred", "trial_3": "failed"}}, ti) == "failed"


def test_the_early_question_is_asked_once_per_process(monkeypatch):
    ti = train("deferred")
    comms = supervisor_comms(monkeypatch, ti)

    async def two_triggers_start() -> None:
        kills.ask_early(ti)
        kills.ask_early(ti)
        await asyncio.gather(*kills._EARLY.values())

    asyncio.run(two_triggers_start())
    assert len(comms.asked) == 1


def is_running(slurm: SlurmHook, job_id: str) -> bool:
    info = slurm.job_info(job_id)
    return info is not None and info.state is JobState.RUNNING


def wait_then_kill(slurm: SlurmHook, monkeypatch, airflow_says: str | None, silent: bool = False) -> tuple[str, list]:
    """As the triggerer does it: a job's wait started (its early question asked), cancelled once the job
    runs, then its `on_kill`, Airflow saying `airflow_says` of the task by then; the job's id and the
    questions the supervisor got."""
    op = SlurmJobOperator(task_id="deferred-kill", program=["bash", "-c", "sleep 120"], **FAST)
    context = make_context("deferred-kill")
    trigger = deferred_trigger(op, context)
    trigger.task_instance = context["ti"]
    comms = supervisor_comms(monkeypatch, context["ti"], silent=silent)

    async def in_the_triggerer() -> None:
        waiting = asyncio.ensure_future(anext(trigger.run()))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not await asyncio.to_thread(is_running, slurm, trigger.job_id):
            await asyncio.sleep(0.2)
        waiting.cancel()
        context["ti"].state = airflow_says
        await trigger.on_kill()

    asyncio.run(in_the_triggerer())
    return trigger.job_id, comms.asked


@pytest.mark.stack
@A_PERSON
def test_on_kill_cancels_the_job_when_a_person_stopped_the_task(slurm: SlurmHook, monkeypatch, airflow_says, capfd):
    job_id, asked = wait_then_kill(slurm, monkeypatch, airflow_says)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and slurm.job_info(job_id).state is not JobState.CANCELLED:
        time.sleep(0.2)
    assert slurm.job_info(job_id).state is JobState.CANCELLED
    assert f"Cancelled Slurm job {job_id}: a person stopped this task" in capfd.readouterr().out
    assert len(asked) == 2  # the early question, then the kill's


@pytest.mark.stack
def test_on_kill_leaves_the_job_running_when_the_wait_moved_to_another_triggerer(slurm: SlurmHook, monkeypatch, capfd):
    job_id, asked = wait_then_kill(slurm, monkeypatch, "deferred")
    try:
        time.sleep(2)
        assert is_running(slurm, job_id)
        out = capfd.readouterr().out
        assert f"Slurm job {job_id} keeps running: Airflow cancelled this wait, but not for a person (deferred)" in out
        assert len(asked) == 2
    finally:
        slurm.cancel(job_id)


@pytest.mark.stack
def test_on_kill_leaves_the_job_running_when_airflow_gives_no_answer(slurm: SlurmHook, monkeypatch, capfd):
    monkeypatch.setattr(kills, "TRIGGER_ASK_TIMEOUT_S", 1.0)
    job_id, _ = wait_then_kill(slurm, monkeypatch, "failed", silent=True)
    try:
        time.sleep(2)
        assert is_running(slurm, job_id)
        out = capfd.readouterr().out
        assert f"Slurm job {job_id} keeps running: Airflow cancelled this wait, but not for a person (no answer" in out
    finally:
        slurm.cancel(job_id)
