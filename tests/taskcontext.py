"""Run operators outside a scheduler: a task-instance stand-in, a task state store, a trigger driver."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any


@dataclass
class FakeTI:
    dag_id: str
    run_id: str
    task_id: str
    map_index: int = -1
    try_number: int = 1
    xcoms: dict[str, Any] = field(default_factory=dict)
    #: What Airflow's execution API says of this task instance's state (get_task_states): a test sets it as
    #: a person's action would ("failed", None: cleared); an exception stands for no answer.
    state: str | Exception | None = "running"

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value

    def get_task_states(self, dag_id: str, task_ids: list[str], run_ids: list[str], map_index: int | None = None):
        """The Task SDK's answer shape: {run_id: {task_id: state}}, for this one task instance."""
        if isinstance(self.state, Exception):
            raise self.state
        assert (dag_id, task_ids, run_ids) == (self.dag_id, [self.task_id], [self.run_id])
        return {self.run_id: {self.task_id: self.state}}


@dataclass
class FakeSupervisorComms:
    """The triggerer's channel to its supervisor (`SUPERVISOR_COMMS`), as a trigger's `on_kill` uses it:
    GetTaskStates answered from `ti.state` as the supervisor answers (a TaskStatesResult); `silent`: never
    answered (a supervisor too busy to answer within the kill's timeout). `asked`: the questions received."""

    ti: FakeTI
    silent: bool = False
    asked: list = field(default_factory=list)

    async def asend(self, msg: Any) -> Any:
        from airflow.sdk.execution_time.comms import GetTaskStates, TaskStatesResult

        assert isinstance(msg, GetTaskStates), msg
        self.asked.append(msg)
        if self.silent:
            await asyncio.Event().wait()
        states = self.ti.get_task_states(
            dag_id=msg.dag_id, task_ids=msg.task_ids, run_ids=msg.run_ids, map_index=msg.map_index
        )
        return TaskStatesResult(task_states=states)


def supervisor_comms(monkeypatch, ti: FakeTI, *, silent: bool = False) -> FakeSupervisorComms:
    """A fake supervisor channel installed where the triggerer installs its own (task_runner's
    SUPERVISOR_COMMS) for the test's length."""
    from airflow.sdk.execution_time import task_runner

    comms = FakeSupervisorComms(ti, silent=silent)
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", comms, raising=False)
    return comms


@dataclass
class MemoryStateStore:
    """Same get/set as Airflow's task state store, which survives retries of one task instance."""

    values: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def set(self, key: str, value: Any, **_: Any) -> None:
        self.values[key] = value


def make_context(task_id: str, *, store: MemoryStateStore | None = None, run_id: str | None = None) -> dict:
    ti = FakeTI(dag_id="slurm_tests", run_id=run_id or f"manual__{uuid.uuid4().hex}", task_id=task_id)
    return {"ti": ti, "run_id": ti.run_id, "task_state_store": store if store is not None else MemoryStateStore()}


def first_event(trigger, timeout: float | None = None) -> dict:
    """The trigger's first event's payload; with `timeout`, a wait past it fails (TimeoutError) and
    cancels the trigger's run instead of blocking the test."""

    async def _first():
        async for event in trigger.run():
            return event.payload
        raise AssertionError("trigger ended without an event")

    return asyncio.run(asyncio.wait_for(_first(), timeout))


def roundtrip(trigger):
    """The trigger as the triggerer builds it: from its class path and serialized kwargs."""
    import importlib

    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    return getattr(importlib.import_module(module), name)(**kwargs)


def deferred_trigger(op, context: dict):
    """execute() up to the deferral; the trigger it hands over, after a serialisation round trip."""
    import pytest
    from airflow.sdk.exceptions import TaskDeferred

    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    return roundtrip(deferred.value.trigger)


def drive(op, context: dict, deferred, rebuild=roundtrip) -> tuple[dict, list[str]]:
    """Run each deferred wait's trigger for real (rebuilt by `rebuild`, as the triggerer would) and resume the
    operator (the method the deferral names), until it returns: its result, and each trigger's waiter."""
    from airflow.sdk.exceptions import TaskDeferred

    waits = []
    while True:
        trigger = rebuild(deferred.trigger)
        waits.append(getattr(trigger, "waiter_name", type(trigger).__name__))
        try:
            return getattr(op, deferred.method_name)(context, event=first_event(trigger)), waits
        except TaskDeferred as again:
            deferred = again


def run_to_end(op, context: dict, timeout: float = 120) -> dict:
    """What a deferrable task does from start to end: execute, its trigger's first event, execute_complete."""
    return op.execute_complete(context, first_event(deferred_trigger(op, context), timeout=timeout))
