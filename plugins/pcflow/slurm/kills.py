"""Whether a killed task was stopped by a person, the one case in which its Slurm job is cancelled.

Airflow sends a running task the same SIGTERM, and so calls the same `on_kill`, when a person marks it
failed or succeeded or clears it (the server answers its supervisor's heartbeat that it should not run),
when the worker shuts down (the supervisor forwards its own SIGTERM), and when its heartbeats fail (the
API server out of reach). Cancelling the job in all of these would turn an orchestrator's restart into a
lost training run (Airflow PR #73454 is about this; SkyPilot #5031 the same in a controller). So the kill
asks Airflow once what this task instance is now: anything but `running` is a person's action, and the
job is cancelled; `running` is the orchestrator going away, and the job keeps running for the next try to
adopt (the operator's exactly-once rules); no answer is treated as the latter.

A deferred wait has the same ambiguity in the triggerer: Airflow cancels a trigger "as a user's action",
and calls its `on_kill`, both when a person stopped the task and when the trigger moved to another
triggerer while this one's heartbeat was late (a busy host, its database away). There the question goes
through the triggerer's own supervisor channel (`SUPERVISOR_COMMS.asend`: the sync Task SDK call made
from a thread gets no answer there), and `deferred` is the orchestrator's word: the wait goes on
elsewhere. The triggerer's supervisor answers its first question slowly (it builds its in-process API
client then: 16-26 s measured, against `on_kill`'s 30 s), so a trigger asks once when it starts
(`ask_early`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from airflow.sdk.execution_time import task_runner
from airflow.sdk.execution_time.comms import GetTaskStates

log = logging.getLogger(__name__)

#: How long a kill waits for Airflow's answer. The question is asked from another thread: the kill runs
#: in a signal handler, which may have interrupted this process in the middle of its own request.
ASK_TIMEOUT_S = 10.0
#: How long a trigger's `on_kill` waits for the answer: within the triggerer's `on_kill_timeout` (30 s),
#: with time left for the scancel; long enough for a question queued behind `ask_early`'s.
TRIGGER_ASK_TIMEOUT_S = 20.0
#: The early question's own: it only warms the channel, and may take long.
EARLY_ASK_TIMEOUT_S = 120.0
#: The one state in which the server still expects this task instance to run (in a worker).
RUNNING = "running"
#: The one state in which the server still expects this task instance's wait to go on (in a triggerer).
DEFERRED = "deferred"


@dataclass(frozen=True)
class KillVerdict:
    """Who stopped the task, as far as Airflow says: `by_person` is True only on its word."""

    by_person: bool
    said: str  # what Airflow answered (a state, "none" for a cleared task), or why there was no answer


def question(ti: Any) -> dict[str, Any]:
    """What to ask Airflow about this one task instance (the Task SDK's get_task_states arguments)."""
    return {"dag_id": ti.dag_id, "task_ids": [ti.task_id], "run_ids": [ti.run_id], "map_index": ti.map_index}


def state_in(states: dict[str, Any], ti: Any) -> str:
    """This task instance's state in Airflow's answer ({run_id: {task_id or task_id_mapindex: state}});
    "none" when it has none (a cleared task)."""
    key = ti.task_id if (ti.map_index is None or ti.map_index < 0) else f"{ti.task_id}_{ti.map_index}"
    state = (states.get(ti.run_id) or {}).get(key)
    return "none" if state is None else str(getattr(state, "value", state))


def task_state_now(ti: Any, timeout: float = ASK_TIMEOUT_S) -> str:
    """The task instance's state as Airflow has it now, asked through the Task SDK from a thread of its own;
    raises TimeoutError or what the Task SDK raised when there is no answer."""
    answer: dict[str, Any] = {}

    def ask() -> None:
        try:
            answer["state"] = state_in(ti.get_task_states(**question(ti)), ti)
        except Exception as exc:  # no Task SDK, the supervisor gone, the API server out of reach
            answer["error"] = exc

    asking = threading.Thread(target=ask, name="pcflow-kill-verdict", daemon=True)
    asking.start()
    asking.join(timeout)
    if asking.is_alive():
        raise TimeoutError(f"Airflow gave no answer within {timeout:.0f} s")
    if "error" in answer:
        raise answer["error"]
    return answer["state"]


def supervisor_channel() -> Any:
    """The process's channel to its supervisor (the triggerer's: set when its runner starts), or None."""
    return getattr(task_runner, "SUPERVISOR_COMMS", None)


async def task_state_asked(ti: Any, timeout: float) -> str:
    """The task instance's state, asked on the supervisor channel without blocking the event loop;
    raises TimeoutError or what the channel raised when there is no answer."""
    comms = supervisor_channel()
    if comms is None:
        raise RuntimeError("no supervisor channel in this process")
    try:
        answer = await asyncio.wait_for(comms.asend(GetTaskStates(**question(ti))), timeout)
    except TimeoutError:
        raise TimeoutError(f"Airflow gave no answer within {timeout:.0f} s") from None
    return state_in(answer.task_states, ti)


def verdict(state: str | Exception, still_ours: str) -> KillVerdict:
    """The rule both kills share: a person stopped the task when Airflow says it is no longer in the
    state the orchestrator leaves it in (`still_ours`); no answer (an exception) is never a person."""
    if isinstance(state, Exception):
        return KillVerdict(False, f"no answer from Airflow ({type(state).__name__}: {state})")
    return KillVerdict(state != still_ours, state)


NO_TASK_INSTANCE = KillVerdict(False, "no task instance to ask about")


def kill_verdict(ti: Any) -> KillVerdict:
    """Whether a worker's kill is a person's action: Airflow says this task instance no longer runs."""
    if ti is None:
        return NO_TASK_INSTANCE
    try:
        return verdict(task_state_now(ti), RUNNING)
    except Exception as exc:
        return verdict(exc, RUNNING)


async def trigger_kill_verdict(ti: Any, timeout: float | None = None) -> KillVerdict:
    """Whether a trigger's cancellation is a person's action: Airflow says the task is no longer deferred.
    Still `deferred`, the trigger moved to another triggerer, whose copy goes on waiting (`timeout`:
    TRIGGER_ASK_TIMEOUT_S when None)."""
    if ti is None:
        return NO_TASK_INSTANCE
    try:
        return verdict(await task_state_asked(ti, TRIGGER_ASK_TIMEOUT_S if timeout is None else timeout), DEFERRED)
    except Exception as exc:
        return verdict(exc, DEFERRED)


#: The early questions in flight, one per supervisor channel (kept: a task nobody holds may be collected).
_EARLY: dict[int, asyncio.Task] = {}


def ask_early(ti: Any) -> None:
    """Ask the supervisor about this task once, in the background, the first time a trigger starts in this
    process: its first answer is slow (see above), and `on_kill` has only `on_kill_timeout` for its own."""
    comms = supervisor_channel()
    if ti is None or comms is None or id(comms) in _EARLY:
        return
    _EARLY[id(comms)] = asyncio.ensure_future(_warm(ti))


async def _warm(ti: Any) -> None:
    """One question whose answer is not needed; no answer is said in the log, not raised."""
    started = time.monotonic()
    try:
        await task_state_asked(ti, timeout=EARLY_ASK_TIMEOUT_S)
    except Exception as exc:
        log.info("No answer to pcflow's early question to the supervisor (%s); a kill asks again", exc)
        return
    log.info("The triggerer's supervisor answered pcflow's early question in %.1f s", time.monotonic() - started)
