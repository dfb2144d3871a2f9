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
from collections.abc import Mapping
from typing import Any


def longest_run(run: Mapping[str, Any]) -> dt.timedelta | None:
    """The longest a run with these validated settings may take from its first stamp to its teardown;
    None when its job has no time limit."""
    from pcflow.slurm.spec import time_limit_seconds

    training, budget = run["training"], run["budget"]
    limit_s = time_limit_seconds(training.get("time_limit"))
    if limit_s is None:
        return None
    attempts = int(training.get("max_restarts") or 0) + 1
    per_attempt = dt.timedelta(seconds=limit_s + float(training.get("pending_timeout_s") or 0))
    trials = len(run.get("trials") or []) or 1
    cluster = dt.timedelta(minutes=float(budget["create_minutes"]) + float(budget["delete_minutes"]))
    return per_attempt * attempts * trials + cluster


def expiry_hours(run: Mapping[str, Any]) -> dict[str, float | None]:
    """The hours ahead a run stamps `pcflow:expires`: on its own resources (`run_hours`) and on what the
    stack keeps (`kept_hours`), with the longest the run may take (`longest_run_hours`, None: unbounded)."""
    longest = longest_run(run)
    hours = None if longest is None else round(longest / dt.timedelta(hours=1), 4)
    ttl, keep = float(run["ttl_hours"]), float(run["teardown"]["keep_hours"])
    return {
        "longest_run_hours": hours,
        "run_hours": ttl if hours is None else max(ttl, hours),
        "kept_hours": keep if hours is None else keep + hours,
    }
