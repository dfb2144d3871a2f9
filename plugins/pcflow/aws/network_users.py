"""Who uses a stack's network: one network per stack, shared by every run of every DAG of the stack, and
deleted only when no run uses it.

Each run that uses the network holds a *reference*: one marker object per run in the stack's data bucket,
`pcflow/networks/<stack>/users/<run key>` (one key per run, as `pcflow.aws.buckets` records a bucket's
stacks: concurrent runs never race on a read-modify-write). The VPC names that bucket in its
`pcflow:references` tag, so the janitor, which has no profile, finds the references too.

Every decision that creates or deletes the network is taken under the stack's network lock, one object
(`pcflow/networks/<stack>/lock`) written only if absent (S3's conditional write, `If-None-Match: *`; the
shared `pcflow.aws.locks.S3Lock`):

- taking: write the reference first, then (under the lock) find or create the network;
- releasing: delete the reference; if no other reference is left, take the lock, list the references
  again, and delete the network only if there is still none and nothing kept (an instance: the nightly's
  kept cluster's head node) is in the VPC.

A run that takes its reference while another run's release holds the lock either wrote it before the
release's second look (the release sees it and keeps the network) or after it (its ensure waits for the
lock and then creates the network again): it never ends up with a deleted network.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pcflow.aws.locks import LockTimeout, S3Lock, read_marker
from pcflow.naming import validate_stack_name
from pcflow.timeouts import STAGE_TIMEOUTS

log = logging.getLogger(__name__)

#: The VPC tag naming the bucket that holds the network's references.
TAG_REFERENCES = "pcflow:references"
PREFIX = "pcflow/networks/"
#: A lock older than this is left by a task that died holding it: the network task holds it within its own
#: timeout, and a run's release of the network (which deletes it as the teardown does) is given the teardown
#: stage's, the longer of the two, as before the timeouts had a module of their own. It may be broken then.
STALE_LOCK = max(STAGE_TIMEOUTS["network"], STAGE_TIMEOUTS["teardown"])


class NetworkLockTimeout(LockTimeout):
    """The stack's network lock stayed held by another run for longer than this task waits."""


@dataclass(frozen=True)
class Reference:
    """One run's reference: its key, and the DAG run the janitor asks Airflow about."""

    run: str
    dag_id: str | None = None
    run_id: str | None = None

    @property
    def dag_run(self) -> tuple[str, str] | None:
        return (self.dag_id, self.run_id) if self.dag_id and self.run_id else None


def users_prefix(stack: str) -> str:
    """Where a stack's network references are kept in its data bucket."""
    return f"{PREFIX}{validate_stack_name(stack)}/users/"


def lock_key(stack: str) -> str:
    """The stack's network lock."""
    return f"{PREFIX}{validate_stack_name(stack)}/lock"


def take_reference(s3: Any, bucket: str, stack: str, run: str, dag_run: tuple[str, str] | None = None) -> None:
    """Record that `run` uses the stack's network (again on a retry: the same key is rewritten)."""
    dag_id, run_id = dag_run or (None, None)
    body = {"run": run, "dag_id": dag_id, "run_id": run_id, "why": "this run uses the stack's network"}
    s3.put_object(Bucket=bucket, Key=users_prefix(stack) + run, Body=json.dumps(body).encode())


def drop_reference(s3: Any, bucket: str, stack: str, run: str) -> None:
    """`run` no longer uses the stack's network (nothing happens when it held no reference)."""
    s3.delete_object(Bucket=bucket, Key=users_prefix(stack) + run)


def references(s3: Any, bucket: str, stack: str, limit: int = 1000) -> list[Reference]:
    """The runs that hold a reference to the stack's network (the first `limit`), each read (bounded)."""
    pages = s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=users_prefix(stack), PaginationConfig={"MaxItems": limit}
    )
    keys = [obj["Key"] for page in pages for obj in page.get("Contents", [])]
    return [ref for ref in (_read_reference(s3, bucket, key) for key in keys) if ref is not None]


def _read_reference(s3: Any, bucket: str, key: str) -> Reference | None:
    """One marker; None when it went meanwhile. A marker pcflow cannot read still counts as a user (never
    delete on doubt)."""
    marker = read_marker(s3, bucket, key)
    if marker is None:
        return None
    found = marker.content
    return Reference(key.rsplit("/", 1)[-1], found.get("dag_id"), found.get("run_id"))


def lock_of(s3: Any, bucket: str, stack: str, holder: str) -> S3Lock:
    """The stack's network lock, for `holder` (a run key: a retry of the same run takes its own over)."""
    why = f"creating or deleting the network of stack {stack}"
    return S3Lock(s3, bucket, lock_key(stack), holder=holder, why=why, stale_after=STALE_LOCK)


@contextmanager
def network_lock(
    s3: Any,
    bucket: str,
    stack: str,
    holder: str,
    *,
    timeout: float = 2400.0,
    delay: float = 5.0,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[None]:
    """Hold the stack's network lock while the body runs, waiting for it in this process (an operator
    defers instead: `EnsureNetworkOperator`)."""
    with lock_of(s3, bucket, stack, holder).held(timeout=timeout, delay=delay, sleep=sleep, error=NetworkLockTimeout):
        yield


def vpc_in_use(ec2: Any, vpc_id: str) -> list[str]:
    """Instances still in the VPC (a kept cluster's head and compute nodes, an image builder): while there
    is one, the network is in use whatever the references say."""
    live = ["pending", "running", "stopping", "stopped", "shutting-down"]
    filters = [{"Name": "vpc-id", "Values": [vpc_id]}, {"Name": "instance-state-name", "Values": live}]
    reservations = ec2.describe_instances(Filters=filters)["Reservations"]
    return sorted(i["InstanceId"] for r in reservations for i in r["Instances"])
