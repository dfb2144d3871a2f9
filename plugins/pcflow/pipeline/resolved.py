"""The validated run document as the first task returns it, declared once as a type: the run spec
(`pcflow.runspec.RunSpec`) plus what the first task adds to it after validation (`settings.resolve_for_run`,
`validation.validate_run`). Every key a later stage reads is a field here, so a stage's read is checked
against this declaration, not found missing (a KeyError) in the middle of a run.

This module holds pydantic models, which a DAG file must not import when it is parsed. DAG files check
their reads (`settings.RUN`) against `run_fields.FIELDS` instead: the field tree of `ResolvedRun`, written
by `PYTHONPATH=plugins python -m pcflow.pipeline.resolved` (after a change to these models or RunSpec). A
test fails when that file no longer matches these models, and another when the first task's document no
longer matches them.
"""

from __future__ import annotations

import types
import typing
import warnings
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pcflow.runspec import DatasetSettings, RunSpec, SweepSettings, TrainingSettings


class _Declared(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Objective(_Declared):
    """What the run is judged by, as the metrics stage and the early-stopping rule read it
    (`metrics.objective` and `metrics.mode`, gathered)."""

    name: str
    mode: Literal["max", "min"]


class EarlyStoppingRule(_Declared):
    """The train task's early-stopping rule (`settings.early_stopping_rule`): the metric's defaults filled
    in from the objective, so the trigger that applies it needs nothing else."""

    objective: Objective
    patience: int
    min_delta: float


class Expiry(_Declared):
    """The hours ahead a run stamps `pcflow:expires` (`pcflow.lifetime.expiry_hours`): on its own
    resources, on what the stack keeps, and the longest the run may take (None: unbounded)."""

    longest_run_hours: float | None
    run_hours: float
    kept_hours: float


class WarmStart(_Declared):
    """The model the run starts from, as the first task resolved it against its run's record (pcflow.warmstart):
    all None when the run names none (or `latest` found none)."""

    source: str | None = Field(description="what training.warm_start said: latest, a run key or a URI")
    uri: str | None
    sha256: str | None = Field(description="the sha256 the writing run recorded, which the bytes were checked against")
    run: str | None = Field(description="the run key of the run that wrote it")


class ResolvedDataset(DatasetSettings):
    """The dataset section with its partition decided (the conf's, the profile's, or the logical date's)."""

    partition: str


with warnings.catch_warnings():  # `allocation` is the value of TrainingSettings.allocation(), so it shadows it
    warnings.filterwarnings("ignore", message='Field name "allocation"', category=UserWarning)

    class ResolvedTraining(TrainingSettings):
        """The training section as it may travel through XCom: the environment by name only (the train task
        reads the values itself, `settings.RunEnv`), the secrets by reference, the Slurm allocation gathered."""

        env: list[str] = Field(description="the names of training.env (their values never go through XCom)")
        secrets: dict[str, dict[str, str]] = Field(description="the secret references among training.env")
        allocation: dict[str, Any] = Field(description="the Slurm resources, in SlurmJobOperator's shape")


class ResolvedSweep(SweepSettings):
    """The sweep section with how many trials run at once decided (`settings.trials_at_once`): the array's
    `%` throttle, the queue's size on ParallelCluster and the cost's count of trials running together."""

    parallel: int = Field(description="trials that run at once: max_parallel, at most the trials, within max_count")


class ResolvedRun(RunSpec):
    """The first task's document: every field a stage may read, the run spec's and the run's own."""

    dataset: ResolvedDataset
    training: ResolvedTraining
    sweep: ResolvedSweep
    run_key: str = Field(description="this run's key, on every resource it tags (pcflow.naming)")
    objective: Objective
    early_stopping: EarlyStoppingRule | None
    trials: list[dict[str, Any]] | None = Field(None, description="a sweep's trials, grid expanded; absent otherwise")
    keep_resources: bool = Field(description="teardown.policy is `never`: the teardowns only report")
    expiry: Expiry
    cost: dict[str, Any] = Field(description="the price, maximum and approval (pcflow.budget.plan_cost)")
    warm_start: WarmStart = Field(description="the model the run starts from (training.warm_start, resolved)")


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
