"""The run as its stages read it, declared once as a type: the run spec (`pcflow.runspec.RunSpec`) plus
what the first task adds to it (`pcflow.pipeline.settings.plan_run`, `pcflow.pipeline.validation`).
`PlannedRun` is what the first task's checks read; `ResolvedRun`, the document it returns, adds the
warm start it resolved and the run's price. Every stage takes one of these (or the section it needs) and
reads attributes, so a misspelt setting fails where it is written, not as a KeyError mid-run.

They sit beside `runspec`, below every stage that reads them (the layers, docs/architecture.md);
`pcflow.pipeline.resolved` loads them from XCom and writes the field tree DAG files check against.
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pcflow.capacity import PlannedOption
from pcflow.runspec import DatasetSettings, RunSpec, SweepSettings, TrainingSettings


class _Declared(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


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

    model_config = ConfigDict(frozen=True)

    partition: str


with warnings.catch_warnings():  # `allocation` is the value of TrainingSettings.allocation(), so it shadows it
    warnings.filterwarnings("ignore", message='Field name "allocation"', category=UserWarning)

    class ResolvedTraining(TrainingSettings):
        """The training section as it may travel through XCom: the environment by name only (the train task
        reads the values itself, `settings.RunEnv`), the secrets by reference, the Slurm allocation gathered."""

        model_config = ConfigDict(frozen=True)

        env: list[str] = Field(description="the names of training.env (their values never go through XCom)")
        secrets: dict[str, dict[str, str]] = Field(description="the secret references among training.env")
        allocation: dict[str, Any] = Field(description="the Slurm resources, in SlurmJobOperator's shape")


class ResolvedSweep(SweepSettings):
    """The sweep section with how many trials run at once decided (`settings.trials_at_once`): the array's
    `%` throttle, the queue's size on ParallelCluster and the cost's count of trials running together."""

    model_config = ConfigDict(frozen=True)

    parallel: int = Field(description="trials that run at once: max_parallel, at most the trials, within max_count")


class PlannedRun(RunSpec):
    """The run as the first task plans it (`pipeline.settings.plan_run`), before it reads a model's bytes and
    prices it: what its checks read. Immutable: a stage that needs another value derives it, it never
    writes one back into the run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dataset: ResolvedDataset
    training: ResolvedTraining
    sweep: ResolvedSweep
    run_key: str = Field(description="this run's key, on every resource it tags (pcflow.naming)")
    objective: Objective
    early_stopping: EarlyStoppingRule | None
    trials: list[dict[str, Any]] | None = Field(None, description="a sweep's trials, grid expanded; absent otherwise")
    keep_resources: bool = Field(description="teardown.policy is `never`: the teardowns only report")
    expiry: Expiry
    capacity_order: list[PlannedOption] = Field(
        description="the capacity options in order, each with its partition and, once the run is priced, its price"
    )

    @property
    def trial_count(self) -> int:
        """How many trials the run's job runs: a sweep's, else 1."""
        return len(self.trials or []) or 1


class ResolvedRun(PlannedRun):
    """The first task's document: every field a stage may read, the run spec's and the run's own. It
    travels through XCom as JSON (`model_dump(mode="json")`); each task validates it once
    (`pcflow.pipeline.resolved.load`) and hands this model to the functions it calls."""

    warm_start: WarmStart = Field(description="the model the run starts from (training.warm_start, resolved)")
    cost: dict[str, Any] = Field(description="the price, maximum and approval (pcflow.budget.plan_cost)")
