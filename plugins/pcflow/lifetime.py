"""How long a run may last, known from its settings, so that what it makes or uses is not stamped to
expire under it.

A trial's Slurm job runs up to its time limit once per attempt (the first and each of `max_restarts`
requeues), after waiting up to `pending_timeout_s` in the queue each time; a sweep's trials may run one
after another; the cluster is created and deleted around them (`budget.create_minutes`,
`delete_minutes`). A run's own resources expire `ttl_hours` after they are stamped, or this long if it
is longer; what a stack keeps for the next run (its image, a nightly's network and cluster) expires
`teardown.keep_hours` after the latest time this run may end. A run without a time limit has no bound:
its resources expire by their TTL alone. Either way the expiry is a backstop: the janitor deletes
nothing of a DAG run Airflow says is queued or running (pcflow.aws.janitor).
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from pcflow.patterns import time_limit_seconds

if TYPE_CHECKING:
    from pcflow.runspec import RunSpec


def longest_run(spec: RunSpec, trials: int = 1) -> dt.timedelta | None:
    """The longest a run with these validated settings (and this many trials, one after another at worst)
    may take from its first stamp to its teardown; None when its job has no time limit."""
    training, budget = spec.training, spec.budget
    limit_s = time_limit_seconds(training.time_limit)
    if limit_s is None:
        return None
    attempts = training.max_restarts + 1
    per_attempt = dt.timedelta(seconds=limit_s + float(training.pending_timeout_s or 0))
    cluster = dt.timedelta(minutes=float(budget.create_minutes) + float(budget.delete_minutes))
    return per_attempt * attempts * max(trials, 1) + cluster


def expiry_hours(spec: RunSpec, trials: int = 1) -> dict[str, float | None]:
    """The hours ahead a run stamps `pcflow:expires`: on its own resources (`run_hours`) and on what the
    stack keeps (`kept_hours`), with the longest the run may take (`longest_run_hours`, None: unbounded)."""
    longest = longest_run(spec, trials)
    hours = None if longest is None else round(longest / dt.timedelta(hours=1), 4)
    ttl, keep = float(spec.ttl_hours), float(spec.teardown.keep_hours)
    return {
        "longest_run_hours": hours,
        "run_hours": ttl if hours is None else max(ttl, hours),
        "kept_hours": keep if hours is None else keep + hours,
    }
