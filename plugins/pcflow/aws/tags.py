"""Tag shapes EC2 takes and returns, and the lookup every "ensure" does before creating."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pcflow.errors import ResourceConflict
from pcflow.naming import STAMPED_TAGS, aws_tags


def tag_specifications(resource_types: str | Iterable[str], tags: Mapping[str, str]) -> list[dict[str, Any]]:
    """`TagSpecifications=`: tags applied atomically with the create call, so a crash never leaves
    an untagged (hence unfindable) resource behind."""
    types = [resource_types] if isinstance(resource_types, str) else list(resource_types)
    return [{"ResourceType": t, "Tags": aws_tags(tags)} for t in types]


def tag_dict(tag_list: Iterable[Mapping[str, str]] | None) -> dict[str, str]:
    """`[{"Key": k, "Value": v}]` -> `{k: v}`."""
    return {t["Key"]: t["Value"] for t in tag_list or ()}


def tag_equals(key: str, value: str) -> dict[str, Any]:
    """The EC2 filter for one tag's value, so lookups by identity are narrowed on the server."""
    return {"Name": f"tag:{key}", "Values": [value]}


class DuplicateResources(ResourceConflict):
    """More than one resource carries an identity that must be unique: pcflow will not guess which."""


def find_one(
    describe: Callable[..., Mapping[str, Any]],
    result_key: str,
    *,
    what: str,
    id_key: str,
    **kwargs: Any,
) -> dict[str, Any] | None:
    """The single resource a describe call returns, None when there is none, an error when ambiguous."""
    found = list(describe(**kwargs).get(result_key, []))
    if len(found) > 1:
        ids = ", ".join(str(r.get(id_key)) for r in found)
        raise DuplicateResources(
            f"{len(found)} {what}s carry the same pcflow identity ({ids}); delete the extra ones "
            "(or run the pcflow teardown for this stack) and retry"
        )
    return found[0] if found else None


def refresh_expiry(ec2: Any, resource_ids: Iterable[str | None], tags: Mapping[str, str]) -> list[str]:
    """Stamp `pcflow:expires` (and the DAG run using them, `pcflow:dag-id`/`pcflow:run-id`) from `tags`
    again on resources an ensure found or made: what a stack keeps between runs (a nightly's network, an
    image) lives its TTL past the last run that used it, and the janitor keeps it while that run is
    unfinished. Returns the ids stamped."""
    ids = sorted({i for i in resource_ids if i})
    stamp = aws_tags({key: tags[key] for key in STAMPED_TAGS if key in tags})
    for start in range(0, len(ids), 1000):  # CreateTags takes at most 1,000 resources
        ec2.create_tags(Resources=ids[start : start + 1000], Tags=stamp)
    return ids
