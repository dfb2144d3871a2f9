"""DatasetLoadOperator through the `aws_default` connection of the local stack (moto server, HTTPS).

The FSx import of a linked file system is in test_fsx_import.py."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import pytest

from pcflow.dataset.digits import materialize_digits
from pcflow.dataset.manifest import read_manifest
from pcflow.dataset.operators import DatasetLoadOperator
from pcflow.naming import run_key

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
