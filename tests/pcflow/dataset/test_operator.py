"""DatasetLoadOperator through the `aws_default` connection of the local stack (moto server, HTTPS).

The FSx import of a linked file system is in test_fsx_import.py."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import pytest
from airflow.sdk.execution_time.context import OutletEventAccessors

from pcflow.dataset.digits import materialize_digits
from pcflow.dataset.manifest import read_manifest
from pcflow.dataset.operators import DatasetLoadOperator
from pcflow.lineage import DATASET, dataset_extra
from pcflow.naming import run_key, run_key_from_context

pytestmark = pytest.mark.stack


def context(run_type: str = "scheduled", logical_date=dt.datetime(2026, 11, 29, tzinfo=dt.UTC)):
    ti = SimpleNamespace(dag_id="pretrain_nightly", run_id=f"{run_type}__2026-11-29T00:00:00+00:00", map_index=-1)
    return {"ti": ti, "dag_run": SimpleNamespace(run_type=run_type), "logical_date": logical_date}


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    return materialize_digits(tmp_path_factory.mktemp("digits"))


def test_scheduled_run_loads_the_partition_of_its_logical_date(s3, bucket, digits, stack_name):
    op = DatasetLoadOperator(
        task_id="load",
        source=str(digits),
        bucket=bucket,
        prefix="datasets/digits",
        stack=stack_name,
        mode="shard",
        target_shard_bytes=1 << 20,
    )
    result = op.execute(context())
    assert result["partition"] == "2026-11-29" and result["root"] == "datasets/digits/2026-11-29/"
    assert result["samples"] == 1797 and result["fsx_import_task_id"] is None
    manifest = read_manifest(s3, bucket, result["root"])
    assert manifest["run"] == run_key("pretrain_nightly", "scheduled__2026-11-29T00:00:00+00:00")
    assert op.hook.conn.meta.config.retries["mode"] == "standard"
    tagging = s3.get_object_tagging(Bucket=bucket, Key=result["manifest_uri"].split(f"{bucket}/", 1)[1])
    assert {t["Key"]: t["Value"] for t in tagging["TagSet"]}["pcflow:component"] == "dataset"


def test_bad_input_fails_before_any_request(bucket, digits, stack_name, s3):
    manual = DatasetLoadOperator(task_id="load", source=str(digits), bucket=bucket, prefix="d", stack=stack_name)
    with pytest.raises(ValueError, match="triggered by hand"):
        manual.execute(context("manual"))
    with pytest.raises(ValueError, match="mode"):
        DatasetLoadOperator(
            task_id="l", source=str(digits), bucket=bucket, prefix="d", stack=stack_name, mode="copy"
        ).execute(context())
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0


def load_events(op: DatasetLoadOperator, ctx: dict) -> tuple[dict, list]:
    """What a load returned, and the events it sent through its alias (as (asset name, extra) pairs)."""
    ctx["outlet_events"] = OutletEventAccessors()
    result = op.execute(ctx)
    events = ctx["outlet_events"][DATASET].asset_alias_events
    return result, [(event.dest_asset_key.name, event.extra) for event in events]


def test_a_partition_with_new_content_is_announced_once(bucket, stack_name, tmp_path):
    """The stack's dataset Asset gets an event with the partition's extras when the run commits new content,
    and again from that run's retry (it may have died after the commit); another run's load of the same
    bytes announces nothing, so a nightly scheduled on data does not start itself again."""
    (tmp_path / "a.txt").write_text("a")
    op = DatasetLoadOperator(
        task_id="load", source=str(tmp_path), bucket=bucket, prefix="d", stack=stack_name, outlets=[DATASET]
    )
    first, events = load_events(op, context())
    assert events == [(f"pcflow-dataset-{stack_name}", dataset_extra(first))]
    assert events[0][1]["partition"] == "2026-11-29" and events[0][1]["content_hash"] == first["content_hash"]
    assert load_events(op, context())[1] == events  # the same run again: its retry
    other = context()
    other["ti"].run_id = "manual__2026-11-30T00:00:00+00:00"
    op.partition = "2026-11-29"
    again, none = load_events(op, other)
    assert none == [] and again["committed_by"] == first["committed_by"] != run_key_from_context(other)


def test_a_run_started_by_new_data_loads_the_partition_its_event_names(bucket, stack_name, tmp_path):
    (tmp_path / "a.txt").write_text("a")

    def event(partition: str, hour: int) -> SimpleNamespace:
        return SimpleNamespace(extra={"partition": partition}, timestamp=dt.datetime(2026, 11, 29, hour, tzinfo=dt.UTC))

    announced = [event("p-old", 1), event("p-new", 2)]
    ctx = context("asset_triggered", logical_date=None)
    ctx["triggering_asset_events"] = {"the stack's dataset": announced}
    op = DatasetLoadOperator(task_id="load", source=str(tmp_path), bucket=bucket, prefix="d", stack=stack_name)
    assert op.execute(ctx)["partition"] == "p-new"  # the newest
    announced.append(event("../x", 3))
    with pytest.raises(ValueError, match=r"invalid partition '\.\./x'"):  # an event's extra is data: validated
        op.execute(ctx)
