"""Operator arguments known only when the task runs: values another task returned, handed over as data.

Airflow resolves a template field whose value has `resolve(context)` by calling it, without Jinja. So a
`Returned` reaches the operator as the other task returned it (type and all), where a Jinja template
rendered natively would literal-evaluate a string (`'..''/''..''/x'` becomes `../../x`, `"0x10"` 16).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Returned:
    """The value task `task_id` returned, or the item at `path` inside it; `optional`: a missing step
    gives None instead of an error. `task_id` names a task of the same task group as the operator that
    resolves it (the DAG's root group for most), so a pipeline declared in a task group reads its own."""

    task_id: str
    path: tuple[str | int, ...] = ()
    optional: bool = False

    def resolve(self, context: Any) -> Any:
        """The value the task returned (or the item at `path`), pulled from XCom when the operator renders its
        fields."""
        group = getattr(context.get("task"), "task_group", None)
        value = context["ti"].xcom_pull(task_ids=group.child_id(self.task_id) if group else self.task_id)
        for step in self.path:
            if self.optional and not _has(value, step):
                return None
            value = value[step]
        return value

    def __str__(self) -> str:  # what the UI shows before the task runs (and the serialized DAG keeps)
        return f"<{'.'.join(map(str, (self.task_id, *self.path)))} as returned>"


def _has(value: Any, step: str | int) -> bool:
    if isinstance(value, dict):
        return value.get(step) is not None
    return isinstance(value, list) and isinstance(step, int) and -len(value) <= step < len(value)


def known_at_run_time(value: Any) -> bool:
    """Whether an operator argument is filled in when the task runs (a `Returned`, an XComArg, a
    template), so the operator cannot check it when the DAG file is parsed."""
    return callable(getattr(value, "resolve", None)) or (isinstance(value, str) and "{{" in value)
