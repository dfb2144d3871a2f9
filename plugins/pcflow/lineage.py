"""The lineage pcflow records as Airflow asset events: the Assets view lists each partition's event and
each model's, which names its partition (partition -> model).

Each stack has Assets of its own, reached through one AssetAlias per kind, because the stack is the
profile's and known when a run starts, not when a DAG file is parsed; so a demo stack's runs never
update a production stack's assets:

- `pcflow-dataset-<stack>` (alias `pcflow-dataset`): the dataset stage's event, each time a run commits
  new content to a partition. Extra: the partition, its S3 location, manifest, content hash and counts.
- `pcflow-pretrained-encoder-<stack>` (alias `pcflow-pretrained-encoder`): the metrics stage's event for
  each model it keeps. Extra: the model's S3 URI and its checkpoint's, with the sha256 of each
  (`model.model_sha256`, `model.checkpoint_sha256`: what `pcflow.artifacts.load_artifact` checks a
  later download against), the metrics summary, and `dataset`: the partition and content hash it was
  trained on, which is what links the two.

A load that finds the partition already holding the same bytes emits nothing: an event means new data,
which is what a nightly scheduled on data waits for (`nightly_schedule`): a re-load does not start it,
nor does the nightly's own load of the partition that started it.

Airflow 3.3's partitioned assets (AIP-76: an event's `partition_key`, PartitionedAssetTimetable) attach
keys only to Assets declared when the DAG is parsed (alias events take the DagRun's key); pcflow's are
decided at run time, so the partition travels in the event's extra. For the same reason the Assets
view's graph (drawn from the Assets tasks declare at parse time) shows no task edges for them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from airflow.sdk import Asset, AssetAlias

from pcflow.patterns import DEFAULT_CRON, NIGHTLY_SCHEDULES

#: The alias the dataset stage emits through: an event of the stack's own dataset Asset.
DATASET = AssetAlias(name="pcflow-dataset")
#: The alias the metrics stage emits each kept model's event through: an event of the stack's own model Asset
#: (`pcflow-pretrained-encoder-<stack>`). A warm start reads the stack's models back through it (pcflow.warmstart).
MODEL = AssetAlias(name="pcflow-pretrained-encoder")
#: What a dataset event (and the model event's `dataset`) says about the partition, from the load's summary.
DATASET_FIELDS = ("partition", "uri", "manifest_uri", "content_hash", "mode", "object_count", "bytes", "samples")


def stack_asset(alias: str, stack: str) -> Asset:
    """The Asset of one stack behind `alias` (what a consumer DAG schedules on)."""
    return Asset(name=f"{alias}-{stack}", uri=f"x-pcflow://{stack}/{alias}")


def dataset_asset(stack: str) -> Asset:
    """The stack's dataset: one Asset, one event per partition a run fills with new content."""
    return stack_asset(DATASET.name, stack)


def nightly_schedule(profile: str | None = None) -> str | Asset:
    """The nightly's schedule, as its profile's `nightly` section says: a cron expression (Airflow checks
    it), or the stack's dataset Asset (a run when a partition gets new content). The profile is the
    deployment's default, the one the nightly's scheduled runs use; without one, the clock's default.
    Called when the DAG file is parsed: it reads that profile's file (no network, no database, no settings
    models: each run's first task validates the whole profile, this section included)."""
    from pcflow.naming import validate_stack_name
    from pcflow.paths import default_profile
    from pcflow.profiles import RunSpecError, load_profile

    name = profile or default_profile()
    document = load_profile(name) if name else {}
    nightly = {"schedule": "clock", "cron": DEFAULT_CRON, **(document.get("nightly") or {})}
    if nightly["schedule"] not in NIGHTLY_SCHEDULES:
        raise RunSpecError(
            f"profile {name!r}: nightly.schedule: {nightly['schedule']!r} is not one of {', '.join(NIGHTLY_SCHEDULES)}"
        )
    if nightly["schedule"] == "data":
        try:
            return dataset_asset(validate_stack_name(document.get("stack")))
        except ValueError as exc:
            raise RunSpecError(f"profile {name!r}: stack: {exc}") from None
    return nightly["cron"]


def emit(context: Mapping[str, Any], outlets: Iterable[Any], stack: str, extra: Mapping[str, Any]) -> None:
    """An event on each outlet: an Asset gets `extra`; an AssetAlias, an event of the stack's own Asset."""
    import json

    events = context.get("outlet_events")
    if events is None:
        return
    extra = json.loads(json.dumps(extra, default=str))
    for outlet in outlets:
        if isinstance(outlet, Asset):
            events[outlet].extra.update(extra)
        elif isinstance(outlet, AssetAlias):
            events[outlet].add(stack_asset(outlet.name, stack), extra=extra)


def dataset_extra(load: Mapping[str, Any]) -> dict[str, Any]:
    """The partition a load summary (DatasetLoadOperator's XCom) describes, for an event's extra."""
    return {field: load[field] for field in DATASET_FIELDS if field in load}


#: What a run records of its code (the ship_payload task's XCom): where it came from and the bundle it was.
CODE_FIELDS = ("source", "url", "commit", "dirty", "digest", "bytes", "files", "uploaded_bytes", "reused")


def code_extra(shipped: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The code a run trained (ship_payload's XCom: an admin's payload or the run's own), for its summary,
    report and the model's event: source, git URL, commit and dirty flag, bundle id and size; None when
    the run shipped none."""
    if not isinstance(shipped, Mapping) or not shipped.get("digest"):
        return None
    return {field: shipped.get(field) for field in CODE_FIELDS} | {"name": shipped.get("name")}


def is_new_content(load: Mapping[str, Any], run: str) -> bool:
    """Did this run commit the partition's content? It wrote the manifest now, or wrote it in an attempt
    that died before the task succeeded (its retry finds the same content, committed by the same run)."""
    return bool(load.get("manifest_written")) or load.get("committed_by") == run


def announced_partition(context: Mapping[str, Any]) -> str | None:
    """The partition the newest of the run's triggering events names (a run started by new data), or None.

    An event names it in its extra (`partition`, as the dataset stage's do) or as its partition key (an
    event posted through the REST API may use either). The caller checks it as a trigger user's choice
    (`pcflow.dataset.partition`), then as any partition."""
    try:
        triggering = context.get("triggering_asset_events") or {}
        events = {id(event): event for events in triggering.values() for event in events}.values()
    except (AttributeError, KeyError, TypeError):  # outside a task (no accessor)
        return None
    named = [(event.timestamp, _partition_of(event)) for event in events if _partition_of(event)]
    if not named:
        return None
    return max(named)[1]


def _partition_of(event: Any) -> str | None:
    partition = (getattr(event, "extra", None) or {}).get("partition") or getattr(event, "partition_key", None)
    return partition if isinstance(partition, str) else None
