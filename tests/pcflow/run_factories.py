"""Runs as the first task makes them, for tests: valid models (`PlannedRun`, `ResolvedRun`), never dicts, so
a test's run has every setting a stage reads and nothing it does not declare. conftest.py offers them as the
`planned_run` and `resolved_run` fixtures; a helper outside a test imports them from here."""

from __future__ import annotations

from typing import Any


def make_planned_run(
    profile: str = "local",
    *,
    trials: list[dict[str, Any]] | None = None,
    run_key: str = "pretrain__manual__test",
    partition: str = "default",
    **overrides: Any,
):
    """A valid `PlannedRun`, as the first task plans it: the profile with `overrides` (run-spec sections,
    deep-merged, e.g. `training={"nodes": 2}`) laid over it, and what the run derives from them (allocation,
    capacity order, trials at once, expiry) derived as the first task derives it."""
    from pcflow.pipeline.settings import plan_run
    from pcflow.runspec import resolve_run_spec

    spec = resolve_run_spec(profile, overrides)
    return plan_run(spec, run_key=run_key, partition=partition, trials=trials)


def make_resolved_run(
    profile: str = "local",
    *,
    warm_start: dict[str, Any] | None = None,
    cost: dict[str, Any] | None = None,
    **kwargs: Any,
):
    """A valid `ResolvedRun` (the first task's document as the model every later task loads): a planned run
    (`make_planned_run`'s arguments) with no warm start and its cost priced from pcflow's table (no AWS)."""
    from pcflow.budget import plan_cost
    from pcflow.pipeline import resolved
    from pcflow.warmstart import NOTHING

    planned = make_planned_run(profile, **kwargs)
    estimate = plan_cost(planned)  # as the first task: the cost, and the capacity options priced
    document = resolved.dump(planned.model_copy(update={"capacity_order": estimate.capacity_order}))
    document["warm_start"] = warm_start or dict(NOTHING)
    document["cost"] = cost if cost is not None else estimate.cost
    return resolved.load(document)
