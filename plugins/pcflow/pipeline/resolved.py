"""The validated run document as the first task returns it, loaded from XCom (`load`), and the field tree
DAG files check their reads against. The models themselves (`ResolvedRun`, `PlannedRun`) live in
`pcflow.resolved`, below the stages that take them.

This module holds pydantic models, which a DAG file must not import when it is parsed. DAG files check
their reads (`settings.RUN`) against `run_fields.FIELDS` instead: the field tree of `ResolvedRun`, written
by `PYTHONPATH=plugins python -m pcflow.pipeline.resolved` (after a change to these models or RunSpec). A
test fails when that file no longer matches these models, and another when the first task's document no
longer matches them.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from pcflow.resolved import (
    EarlyStoppingRule,
    Expiry,
    Objective,
    PlannedRun,
    ResolvedDataset,
    ResolvedRun,
    ResolvedSweep,
    ResolvedTraining,
    WarmStart,
)
from pcflow.runspec import RESOLVED

__all__ = [
    "EarlyStoppingRule",
    "Expiry",
    "Objective",
    "PlannedRun",
    "ResolvedDataset",
    "ResolvedRun",
    "ResolvedSweep",
    "ResolvedTraining",
    "WarmStart",
    "dump",
    "field_tree",
    "load",
]


def load(value: ResolvedRun | Mapping[str, Any]) -> ResolvedRun:
    """The first task's document as the model, validated once where a task receives it from XCom (JSON at
    the task boundary); a model is returned as it is."""
    return value if isinstance(value, ResolvedRun) else ResolvedRun.model_validate(value, context={RESOLVED: True})


def dump(run: PlannedRun) -> dict[str, Any]:
    """The run as XCom carries it: JSON, what `load` reads back."""
    return run.model_dump(mode="json")


#: The fields a first task's document may lack (a run that is no sweep has no trials).
OPTIONAL_KEYS = frozenset({"trials"})


def sub_model(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds (also when it may be None), else None: a path goes on into a sub-model's
    fields and ends at any other value (a dict- or list-typed field is read whole)."""
    candidates = [annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        candidates = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    if len(candidates) == 1 and isinstance(candidates[0], type) and issubclass(candidates[0], BaseModel):
        return candidates[0]
    return None


def field_tree(model: type[BaseModel] = ResolvedRun) -> dict[str, Any]:
    """Each field of `model` by name: a sub-model's own tree, or None for a value. What `settings.RUN`
    checks a DAG's reads against when the DAG is built, without importing these models."""
    return {
        name: None if (sub := sub_model(field.annotation)) is None else field_tree(sub)
        for name, field in model.model_fields.items()
    }


def field_module() -> str:
    """The text of `run_fields.py`: `field_tree()` as a literal, which a DAG file imports in no time."""
    lines = [
        '"""The field tree of the first task\'s document (`pcflow.pipeline.resolved.ResolvedRun`): a model\'s',
        "fields by name, None for a value. Generated; do not edit: `PYTHONPATH=plugins python -m",
        'pcflow.pipeline.resolved` writes it again."""',
        "",
        "from typing import Any",
        "",
        "FIELDS: dict[str, Any] = {",
        *_tree_lines(field_tree(), "    "),
        "}",
    ]
    return "\n".join(lines) + "\n"


def _tree_lines(tree: dict[str, Any], indent: str) -> list[str]:
    lines = []
    for name, sub in tree.items():
        if sub is None:
            lines.append(f'{indent}"{name}": None,')
        else:
            lines += [f'{indent}"{name}": {{', *_tree_lines(sub, indent + "    "), f"{indent}}},"]
    return lines


def write_field_module() -> Path:
    """Write `run_fields.py` next to this module (after a change to the models); returns its path."""
    path = Path(__file__).with_name("run_fields.py")
    path.write_text(field_module())
    return path


if __name__ == "__main__":
    print(f"wrote {write_field_module()}")
