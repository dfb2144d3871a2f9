"""Live pcflow resources by stack, their cost per day, and what the janitor would delete now.

The same lookups as the janitor (pcflow.aws.janitor: its handler sets list every pcflow-tagged network
part, instance, image, snapshot, file system and ParallelCluster stack), its own dry run for "would
delete", and pcflow.aws.kept for the prices. Buckets are listed by their tags (a shared bucket names the
stacks using it by marker objects, pcflow.aws.buckets). Every listing is bounded."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pcflow.aws.buckets import USERS_PREFIX
from pcflow.aws.janitor import JANITOR_HANDLER_SETS, kept_report, kept_resources, reapable, run_janitor
from pcflow.aws.teardown import Selector
from pcflow.naming import TAG_PREFIX, TAG_STACK

MAX_BUCKETS = 200
MAX_STACKS_PER_BUCKET = 100
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


def overview(clients: Callable[[str], Any], region: str | None, now: dt.datetime | None = None) -> Overview:
    """Every live pcflow resource, by stack, priced; and what the janitor would delete now (priced too:
    it bills until then)."""
    now = now or dt.datetime.now(dt.UTC)
    dry_run = run_janitor(clients, now=now, dry_run=True, handler_sets=JANITOR_HANDLER_SETS)
    rule = reapable(now)  # as the janitor DAG decides: by expiry
    kept = kept_resources(clients, Selector(predicate=lambda tags: not rule(tags)), JANITOR_HANDLER_SETS)
    costs = kept_report([*dry_run.would_delete, *dry_run.held, *kept], region)  # held: reapable, kept for now
    doomed = {(r.kind, r.id) for r in dry_run.would_delete}
    stacks: dict[str, list[dict[str, Any]]] = {}
    for priced in [*costs["kept"], *bucket_lines(clients("s3"))]:
        line = {**priced, "reaped": (priced["kind"], priced["id"]) in doomed}
        stacks.setdefault(line["stack"] or NO_STACK, []).append(line)
    totals = {
        stack: round(sum(line["usd_per_day"] or 0 for line in lines), 2) for stack, lines in sorted(stacks.items())
    }
    would_delete = [line for lines in stacks.values() for line in lines if line["reaped"]]
    return Overview(dict(sorted(stacks.items())), totals, would_delete, costs["prices"])


def bucket_lines(s3: Any) -> list[dict[str, Any]]:
    """pcflow's buckets (any `pcflow:` tag), one line per stack using each: its own `pcflow:stack`, or the
    stacks whose marker a shared bucket holds. S3 bills by bytes stored, which listing does not tell."""
    from pcflow.aws.storage import bucket_tags

    lines = []
    for bucket in s3.list_buckets().get("Buckets", [])[:MAX_BUCKETS]:
        tags = bucket_tags(s3, bucket["Name"])
        if not any(key.startswith(TAG_PREFIX) for key in tags):
            continue
        for stack in [tags[TAG_STACK]] if TAG_STACK in tags else bucket_users(s3, bucket["Name"]) or [None]:
            lines.append(
                {
                    "kind": "bucket",
                    "id": bucket["Name"],
                    "stack": stack,
                    "usd_per_day": None,
                    "basis": "billed by bytes stored" + ("" if TAG_STACK in tags else "; shared by stacks"),
                }
            )
    return lines


def bucket_users(s3: Any, bucket: str) -> list[str]:
    """The stacks that left their marker in a shared bucket."""
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=USERS_PREFIX, MaxKeys=MAX_STACKS_PER_BUCKET)
    return [item["Key"].removeprefix(USERS_PREFIX) for item in listed.get("Contents", [])]


def resource_summary(lines: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """How many of each kind a stack keeps alive (network parts, instances, images, ...)."""
    counts: dict[str, int] = {}
    for line in lines:
        counts[line["kind"]] = counts.get(line["kind"], 0) + 1
    return counts


def connection_clients(aws_conn_id: str = "aws_default") -> tuple[Callable[[str], Any], str | None]:
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
