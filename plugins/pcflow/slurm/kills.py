"""Whether a killed task was stopped by a person, the one case in which its Slurm job is cancelled.

Airflow sends a running task the same SIGTERM, and so calls the same `on_kill`, when a person marks it
failed or succeeded or clears it (the server answers its supervisor's heartbeat that it should not run),
when the worker shuts down (the supervisor forwards its own SIGTERM), and when its heartbeats fail (the
API server out of reach). Cancelling the job in all of these would turn an orchestrator's restart into a
lost training run (Airflow PR #73454 is about this; SkyPilot #5031 the same in a controller). So the kill
asks Airflow once what this task instance is now: anything but `running` is a person's action, and the
job is cancelled; `running` is the orchestrator going away, and the job keeps running for the next try to
adopt (the operator's exactly-once rules); no answer is treated as the latter. A deferred wait needs
none of this: the triggerer calls its trigger's `on_kill` only on a person's action.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

#: How long a kill waits for Airflow's answer. The question is asked from another thread: the kill runs
#: in a signal handler, which may have interrupted this process in the middle of its own request.
ASK_TIMEOUT_S = 10.0
#: The one state in which the server still expects this task instance to run.
RUNNING = "running"


@dataclass(frozen=True)
class KillVerdict:
    """Who stopped the task, as far as Airflow says: `by_person` is True only on its word."""

    by_person: bool
    said: str  # what Airflow answered (a state, "none" for a cleared task), or why there was no answer


def task_state_now(ti: Any, timeout: float = ASK_TIMEOUT_S) -> str:
    """The task instance's state as Airflow has it now ("none": no state, a cleared task); raises
    TimeoutError or what the Task SDK raised when there is no answer."""
    answer: dict[str, Any] = {}

    def ask() -> None:
        try:
            states = ti.get_task_states(
                dag_id=ti.dag_id, task_ids=[ti.task_id], run_ids=[ti.run_id], map_index=ti.map_index
            )
            key = ti.task_id if (ti.map_index is None or ti.map_index < 0) else f"{ti.task_id}_{ti.map_index}"
            answer["state"] = (states.get(ti.run_id) or {}).get(key)
        except Exception as exc:  # no Task SDK, the supervisor gone, the API server out of reach
            answer["error"] = exc

    asking = threading.Thread(target=ask, name="pcflow-kill-verdict", daemon=True)
    asking.start()
    asking.join(timeout)
    if asking.is_alive():
        raise TimeoutError(f"Airflow gave no answer within {timeout:.0f} s")
    if "error" in answer:
        raise answer["error"]
    state = answer["state"]
    return "none" if state is None else str(getattr(state, "value", state))


def kill_verdict(ti: Any) -> KillVerdict:
    """Whether the kill is a person's action: Airflow says this task instance no longer runs."""
    if ti is None:
        return KillVerdict(False, "no task instance to ask about")
    try:
        state = task_state_now(ti)
    except Exception as exc:
        return KillVerdict(False, f"no answer from Airflow ({type(exc).__name__}: {exc})")
    return KillVerdict(state != RUNNING, state)
