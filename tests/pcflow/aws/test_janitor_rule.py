"""The janitor's rule, as a table: expiry decides only once Airflow says the resource's DAG run is
finished or gone; a queued or running run keeps what it made whatever its expiry, and so does an answer
Airflow does not give. No stack needed: the run states are given."""

from __future__ import annotations

import datetime as dt

import pytest
from airflow.sdk.exceptions import AirflowRuntimeError, ErrorType
from airflow.sdk.execution_time.comms import ErrorResponse

from pcflow.aws.janitor import JanitorRule, RunStateUnknown, task_run_state

NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
PAST, FUTURE = "2026-11-29T11:00:00Z", "2026-11-29T13:00:00Z"
STATES = {"running": "running", "queued": "queued", "done": "success", "failed": "failed"}


def airflow(dag_id: str, run_id: str) -> str | None:
    """Airflow as the rule sees it: these runs of `pretrain`; `flaky` gets no answer; others are gone."""
    assert dag_id == "pretrain"
    if run_id == "flaky":
        raise RunStateUnknown("execution API: 503")
    return STATES.get(run_id)


def tags(expires: str, run_id: str | None = None) -> dict[str, str]:
    named = {"pcflow:dag-id": "pretrain", "pcflow:run-id": run_id} if run_id else {}
    return {"pcflow:stack": "research", "pcflow:run": "pretrain-x-1234abcd", "pcflow:expires": expires, **named}


@pytest.mark.parametrize(
    ("expires", "run_id", "reaped", "why"),
    [
        (PAST, "running", False, "kept: run active (pretrain running is running"),
        (PAST, "queued", False, "kept: run active (pretrain queued is queued"),
        (PAST, "flaky", False, "kept: run state unknown (pretrain flaky: execution API: 503)"),
        (PAST, "done", True, "DAG run pretrain done is success"),
        (PAST, "failed", True, "DAG run pretrain failed is failed"),
        (PAST, "gone", True, "DAG run pretrain gone no longer exists"),
        (PAST, None, True, "names no DAG run"),  # tagged before DAG runs were named, or an untaggable run id
        (FUTURE, "done", False, f"kept: expires {FUTURE}"),
        (FUTURE, None, False, f"kept: expires {FUTURE}"),
        ("never", "done", False, "kept: never expires"),  # shared
        ("garbage", "done", False, "kept: unreadable pcflow:expires='garbage'"),
    ],
)
def test_the_rule_table(expires, run_id, reaped, why):
    rule = JanitorRule(NOW, airflow)
    assert rule(tags(expires, run_id)) is reaped
    assert why in rule.why(tags(expires, run_id))


def test_without_airflow_to_ask_an_expired_run_is_kept():
    rule = JanitorRule(NOW)
    assert not rule(tags(PAST, "done"))
    assert rule.why(tags(PAST, "done")).startswith("kept: run state unknown")
    assert rule(tags(PAST))  # names no DAG run: expiry alone


def test_airflow_is_asked_once_per_dag_run_and_only_about_expired_resources():
    asked = []

    def counting(dag_id: str, run_id: str) -> str | None:
        asked.append(run_id)
        return "running"

    rule = JanitorRule(NOW, counting)
    for _ in range(3):
        assert not rule(tags(PAST, "a")) and not rule(tags(FUTURE, "b"))
    assert asked == ["a"]


class _TaskInstance:
    """A task's `ti` as the Task SDK gives it: `get_dagrun_state` answers, or raises what the supervisor
    relays from the execution API."""

    def __init__(self, answer):
        self.answer = answer

    def get_dagrun_state(self, dag_id: str, run_id: str):
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def api_error(status_code: int | None) -> AirflowRuntimeError:
    detail = {"status_code": status_code, "message": "from the execution API"}
    return AirflowRuntimeError(ErrorResponse(error=ErrorType.API_SERVER_ERROR, detail=detail))


def test_the_task_sdk_answer_read_as_a_run_state():
    from airflow.utils.state import DagRunState

    assert task_run_state(_TaskInstance(DagRunState.RUNNING))("pretrain", "r") == "running"
    assert task_run_state(_TaskInstance("success"))("pretrain", "r") == "success"
    assert task_run_state(_TaskInstance(api_error(404)))("pretrain", "r") is None  # no such DAG run
    for unknown in (api_error(500), api_error(None), ConnectionError("supervisor gone")):
        with pytest.raises(RunStateUnknown):
            task_run_state(_TaskInstance(unknown))("pretrain", "r")
    with pytest.raises(RunStateUnknown):
        task_run_state(object())("pretrain", "r")  # a context without the Task SDK's ti
