"""Which partition a run loads: its logical date when scheduled, an explicit one when triggered by hand.

Nightly runs train on the data of their date and backfills re-read old dates, so the logical date is
the natural key; a nightly scheduled on new data trains on the partition the data's event names; a
manual run has no meaningful date and must say which partition it wants.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pcflow.errors import refused, trigger_user
from pcflow.patterns import validate_prefix  # noqa: F401 - the dataset stage checks its prefix with it

PARTITION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=-]{0,127}$")
DATE_FORMAT = "%Y-%m-%d"


#: Who names the partition of a run scheduled on new data: the producer of the asset event it consumed.
ANNOUNCED_BY = "the DAG that announced the data sets this (its asset event's `partition` extra)"


def validate_partition(partition: str, owner: str | None = None) -> str:
    """A single S3 key segment: letters, digits, `. _ = -`; no slashes, no `..`. `owner`: who set it
    (errors.py's words; default: the run's conf)."""
    if not isinstance(partition, str) or not PARTITION_RE.fullmatch(partition) or ".." in partition:
        problem = (
            f"invalid partition {partition!r}: use one path segment of letters, digits, '.', '_', '=' or '-' "
            "(for example '2026-11-29' or 'v3')"
        )
        raise refused("dataset.partition", problem, owner or trigger_user())
    return partition


def resolve_partition(context: Mapping[str, Any], explicit: str | None = None) -> str:
    """Explicit partition if given; else the one the newest event that started the run names (a run
    scheduled on new data: `pcflow.lineage`); else the logical date (`YYYY-MM-DD`) of a scheduled or
    backfill run."""
    from pcflow.lineage import announced_partition
    from pcflow.runspec import check_conf

    if explicit:
        return validate_partition(explicit)
    announced = announced_partition(context)
    if announced:
        # Whoever posts an event chooses the partition as a trigger user would: the run's profile must let a
        # trigger user change `dataset.partition` (both shipped profiles do). RunSpecError names the field.
        profile = (context.get("params") or {}).get("profile")
        if profile:
            check_conf(profile, {"dataset": {"partition": announced}})
        return validate_partition(announced, ANNOUNCED_BY)
    dag_run = context.get("dag_run")
    run_type = str(getattr(dag_run, "run_type", "") or "").lower()
    logical_date = context.get("logical_date")
    if run_type.endswith("manual") or logical_date is None:
        problem = (
            "this run was triggered by hand (or has no logical date): pass partition='...' "
            "(for example in the trigger form), so it is clear which data partition to load"
        )
        raise refused("dataset.partition", problem, trigger_user())
    return validate_partition(logical_date.strftime(DATE_FORMAT))
