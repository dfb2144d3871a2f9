"""Live pcflow resources by stack, their cost per day, and what the janitor would delete now.

The same lookups as the janitor (pcflow.aws.janitor: its handler sets list every pcflow-tagged network
part, instance, image, snapshot, file system and ParallelCluster stack), listed once for both its dry
run ("would delete") and what it keeps, and pcflow.aws.kept for the prices. Buckets, priced by the bytes
they store, come from pcflow.aws.kept_buckets (a shared bucket names the stacks using it by marker
objects). Every listing is bounded."""

from __future__ import annotations

import concurrent.futures
import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pcflow.cluster.teardown  # noqa: F401 - registers "pcluster", one of JANITOR_HANDLER_SETS
from pcflow.aws.clients import DEFAULT_AWS_CONN_ID
from pcflow.aws.janitor import JANITOR_HANDLER_SETS, RunState, janitor_view, kept_report, no_airflow
from pcflow.aws.kept_buckets import kept_buckets

#: Shown for a resource no stack tag names: a bucket shared by stacks that no longer use it, say.
NO_STACK = "(none)"


@dataclass
class Overview:
    """Each stack's resources (one line each: kind, id, USD per day or None, basis), the stacks' daily
    totals, and the janitor's dry run."""

    stacks: dict[str, list[dict[str, Any]]]
    usd_per_day: dict[str, float]
    would_delete: list[dict[str, Any]]
    prices: str


def overview(
    clients: Callable[[str], Any], region: str | None, now: dt.datetime | None = None, run_state: RunState = no_airflow
) -> Overview:
    """Every live pcflow resource, by stack, priced; and what the janitor would delete now (priced too:
    it bills until then), its DAG runs' states read by `run_state` as the janitor asks Airflow for them."""
    now = now or dt.datetime.now(dt.UTC)
    clients("s3"), clients("cloudwatch")  # made here: a botocore session does not make clients thread-safely
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="pcflow-buckets") as pool:
        sizing = pool.submit(kept_buckets, clients, region, None, now)  # S3 and CloudWatch, while EC2 lists
        dry_run, kept = janitor_view(clients, now, JANITOR_HANDLER_SETS, run_state)  # as the janitor decides
        buckets = sizing.result()
    costs = kept_report([*dry_run.would_delete, *dry_run.held, *kept, *buckets], region)  # held: kept for now
    doomed = {(r.kind, r.id) for r in dry_run.would_delete}
    stacks: dict[str, list[dict[str, Any]]] = {}
    for priced in costs["kept"]:
        line = {**priced, "reaped": (priced["kind"], priced["id"]) in doomed}
        stacks.setdefault(line["stack"] or NO_STACK, []).append(line)
    totals = {
        stack: round(sum(line["usd_per_day"] or 0 for line in lines), 2) for stack, lines in sorted(stacks.items())
    }
    would_delete = [line for lines in stacks.values() for line in lines if line["reaped"]]
    return Overview(dict(sorted(stacks.items())), totals, would_delete, costs["prices"])


def resource_summary(lines: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """How many of each kind a stack keeps alive (network parts, instances, images, ...)."""
    counts: dict[str, int] = {}
    for line in lines:
        counts[line["kind"]] = counts.get(line["kind"], 0) + 1
    return counts


def connection_clients(aws_conn_id: str = DEFAULT_AWS_CONN_ID) -> tuple[Callable[[str], Any], str | None]:
    """Retrying clients of the deployment's AWS connection (as the janitor's operator makes them), and its region."""
    from airflow.providers.amazon.aws.hooks.ec2 import EC2Hook

    from pcflow.aws.clients import client_from_hook

    hook = EC2Hook(api_type="client_type", aws_conn_id=aws_conn_id)
    made: dict[str, Any] = {}

    def clients(service: str) -> Any:
        if service not in made:
            made[service] = client_from_hook(hook, None if service == "ec2" else service)
        return made[service]

    return clients, hook.region_name
