"""Deterministic names and tags, derived from the run so that a retry finds what a crash left behind.

Nothing here reads the clock or a random source except `standard_tags`' expiry, which is a label
for the janitor, never part of an identity.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from pcflow.errors import ConfigurationError

TAG_PREFIX = "pcflow:"
TAG_STACK = "pcflow:stack"
TAG_RUN = "pcflow:run"
TAG_COMPONENT = "pcflow:component"
TAG_EXPIRES = "pcflow:expires"
NEVER_EXPIRES = "never"
#: A resource several stacks use (the dataset bucket) names no owning stack: it says it is shared and
#: which stack created it (its users are recorded elsewhere: `pcflow.aws.buckets`).
TAG_SHARED = "pcflow:shared"
TAG_CREATED_BY = "pcflow:created-by"
#: The DAG run a resource belongs to (a run's own) or that last used it (what a stack keeps): the janitor
#: asks Airflow for that run's state and keeps what an unfinished run may still need. The run key
#: (`pcflow:run`) cannot be looked up: it is a digest.
TAG_DAG_ID = "pcflow:dag-id"
TAG_RUN_ID = "pcflow:run-id"
#: What every run stamps again on what it adopts: its expiry and itself as the last user.
STAMPED_TAGS = (TAG_EXPIRES, TAG_DAG_ID, TAG_RUN_ID)

#: Longest run key: fits Slurm job names, S3 key segments, AWS Name tags and a ParallelCluster name
#: with a prefix, and stays readable in `squeue`.
RUN_KEY_MAX_LEN = 48
DIGEST_LEN = 8
STACK_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,22}[a-z0-9]$|^[a-z]$")
# AWS tag values: letters, digits, spaces and _ . : / = + - @ ; at most 256 characters.
AWS_TAG_VALUE_RE = re.compile(r"^[\w .:/=+\-@]{0,256}$")


class Component(StrEnum):
    """What part of the pipeline a resource belongs to; the teardown order is decided per component."""

    NETWORK = "network"
    AMI = "ami"
    STORAGE = "storage"
    DATASET = "dataset"
    CLUSTER = "cluster"
    TRAIN = "train"
    METRICS = "metrics"


def slug(text: str, max_len: int) -> str:
    """Lower-case ASCII letters, digits and single hyphens; never starts or ends with a hyphen."""
    cleaned = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return cleaned[:max_len].rstrip("-")


def digest(*parts: Any, length: int = DIGEST_LEN) -> str:
    """A short, stable hash of the exact inputs (JSON-encoded, so ("a-b",) and ("a", "b") differ)."""
    payload = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()[:length]


def _fit(readable: list[str], tail: str, max_len: int) -> str:
    """Join readable parts and a unique tail, trimming the readable parts (never the tail) to fit."""
    budget = max_len - len(tail) - 1
    head = "-".join(p for p in readable if p)[:budget].rstrip("-")
    name = f"{head}-{tail}" if head else tail
    return name if name[0].isalpha() else f"r{name}"[:max_len]


def run_key(dag_id: str, run_id: str, map_index: int | None = None) -> str:
    """The identity of one run (or one mapped trial of it) in every system pcflow touches.

    Readable prefix for humans, digest of the exact (dag_id, run_id, map_index) for uniqueness; the
    try number is deliberately absent, so every retry of a task computes the same key.
    """
    if not dag_id or not run_id:
        raise ValueError("run_key needs a dag_id and a run_id")
    index = None if map_index is None or map_index < 0 else int(map_index)
    readable = [slug(dag_id, 16), slug(_compact_run_id(run_id), 22)]
    if index is not None:
        readable.append(f"m{index}")
    return _fit(readable, digest(dag_id, run_id, index), RUN_KEY_MAX_LEN)


def _compact_run_id(run_id: str) -> str:
    """`manual__2026-11-29T18:17:00.123456+00:00` -> `manual 20261129T181700`: the informative part."""
    kind, _, stamp = run_id.partition("__")
    if not stamp:
        return run_id
    digits = re.sub(r"[^0-9T]", "", stamp.split(".")[0].split("+")[0])
    return f"{kind} {digits}"


def run_key_from_context(context: Mapping[str, Any]) -> str:
    """The run key of the task instance an operator is executing in."""
    ti = context["ti"]
    return run_key(ti.dag_id, ti.run_id, getattr(ti, "map_index", None))


def dag_run_of(context: Mapping[str, Any]) -> tuple[str, str]:
    """(dag_id, run_id) of the task instance an operator is executing in: what `pcflow:dag-id` and
    `pcflow:run-id` name."""
    ti = context["ti"]
    return ti.dag_id, ti.run_id


def dag_run_tags(dag_run: tuple[str, str] | None) -> dict[str, str]:
    """`pcflow:dag-id` and `pcflow:run-id` of a DAG run; none when a value is not one AWS takes in a tag
    (a run id with `~`, which Airflow's default pattern allows): the janitor then decides by expiry."""
    if dag_run is None:
        return {}
    tags = dict(zip((TAG_DAG_ID, TAG_RUN_ID), dag_run, strict=True))
    return tags if all(value and AWS_TAG_VALUE_RE.fullmatch(value) for value in tags.values()) else {}


def validate_stack_name(name: str) -> str:
    """A stack groups shared resources (network, AMI, cluster) across runs; it appears in AWS names."""
    if not isinstance(name, str) or not STACK_NAME_RE.fullmatch(name):
        raise ConfigurationError(
            f"invalid stack name {name!r}: use 1-24 lower-case letters, digits and hyphens, "
            "starting with a letter and not ending with a hyphen (for example 'research' or 'team-a')"
        )
    return name


def resource_name(stack: str, component: Component | str, *parts: str, max_len: int = 63) -> str:
    """`pcflow-<stack>-<component>[-<parts>]`, shortened with a digest when it would not fit."""
    validate_stack_name(stack)
    readable = ["pcflow", stack, slug(str(component), 20), *(slug(p, 48) for p in parts)]
    full = "-".join(p for p in readable if p)
    if len(full) <= max_len:
        return full
    return _fit(readable, digest(stack, str(component), *parts), max_len)


def expires_at(ttl: dt.timedelta | None, now: dt.datetime | None = None) -> str:
    """ISO-8601 UTC expiry (`2026-11-30T18:00:00Z`), or `never`."""
    if ttl is None:
        return NEVER_EXPIRES
    now = now or dt.datetime.now(dt.UTC)
    return (now.astimezone(dt.UTC) + ttl).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_expires(value: str | None) -> dt.datetime | None:
    """The expiry a tag holds; None for `never` or a missing tag. Unreadable values raise."""
    if value is None or value == NEVER_EXPIRES:
        return None
    return dt.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)


def expiry_advances(current: str | None, wanted: str, *, by: dt.timedelta) -> bool:
    """Whether moving an expiry tag from `current` to `wanted` postpones it by more than `by` (a resource
    whose tag costs an update to change, a cluster, is re-tagged once per run, not on every retry)."""
    try:
        before, after = parse_expires(current), parse_expires(wanted)
    except ValueError:  # unreadable: replace it
        return True
    if after is None or before is None:
        return (current or NEVER_EXPIRES) != wanted
    return after - before > by


def standard_tags(
    *,
    stack: str,
    component: Component | str,
    run: str | None = None,
    ttl: dt.timedelta | None = None,
    now: dt.datetime | None = None,
    extra: Mapping[str, str] | None = None,
    dag_run: tuple[str, str] | None = None,
) -> dict[str, str]:
    """The tags every created resource carries; `run` is absent for resources shared across runs, and
    `dag_run` (dag_id, run_id) names the DAG run that makes or uses the resource (`dag_run_tags`)."""
    tags = {
        TAG_STACK: validate_stack_name(stack),
        TAG_COMPONENT: str(Component(component)),
        TAG_EXPIRES: expires_at(ttl, now),
        **dag_run_tags(dag_run),
    }
    if run is not None:
        tags[TAG_RUN] = run
    for key, value in (extra or {}).items():
        if key.startswith(TAG_PREFIX) and key in tags:
            raise ConfigurationError(f"extra tag {key!r} would override a standard pcflow tag")
        tags[key] = value
    for key, value in tags.items():
        if not AWS_TAG_VALUE_RE.fullmatch(value):
            raise ConfigurationError(f"tag {key}={value!r} has characters AWS does not accept in tag values")
    return tags


def shared_tags(*, created_by: str, component: Component | str) -> dict[str, str]:
    """Tags of a resource shared by stacks: no `pcflow:stack` (no stack's teardown selects it), never
    expires (the janitor leaves it), and the stack that created it."""
    return {
        TAG_COMPONENT: str(Component(component)),
        TAG_SHARED: "stacks",
        TAG_CREATED_BY: validate_stack_name(created_by),
        TAG_EXPIRES: NEVER_EXPIRES,
    }


def aws_tags(tags: Mapping[str, str]) -> list[dict[str, str]]:
    """Tags in the `[{"Key": ..., "Value": ...}]` shape EC2, FSx and CloudFormation take."""
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def tag_filters(stack: str, component: Component | str | None = None, run: str | None = None) -> list[dict]:
    """EC2 `Filters=` selecting pcflow resources of a stack (and optionally one component or run)."""
    filters = [{"Name": f"tag:{TAG_STACK}", "Values": [validate_stack_name(stack)]}]
    if component is not None:
        filters.append({"Name": f"tag:{TAG_COMPONENT}", "Values": [str(Component(component))]})
    if run is not None:
        filters.append({"Name": f"tag:{TAG_RUN}", "Values": [run]})
    return filters
