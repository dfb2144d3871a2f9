"""FSx import of a newly loaded prefix into a file system that is already linked to the bucket.

Real as far as the emulator goes: the dataset goes into S3 on the local stack's moto server, and the
file system is created and described there. moto 5.2.5 (the newest release) implements neither data
repository associations nor data repository tasks (it answers 500), so those three calls are answered
by a stand-in that follows the FSx API reference: botocore still validates every request against
the FSx service model, and the stand-in's responses are validated against it too (as botocore's
Stubber does). The triggerer's wait runs the real trigger on an aiobotocore client with AioStubber.
Tests that depend on the stand-in carry `standin` in their names.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace

import boto3
import pytest
from aiobotocore.stub import AioStubber
from fsx_standin import CREATED, FsxStandIn

from pcflow.aws.waits import FsxDataRepositoryTaskTrigger, FsxHook
from pcflow.dataset.manifest import read_manifest
from pcflow.dataset.operators import DatasetLoadOperator

pytestmark = pytest.mark.stack
IMPORT = "IMPORT_METADATA_FROM_REPOSITORY"


def context():
    ti = SimpleNamespace(dag_id="pretrain_nightly", run_id="scheduled__2026-11-29T00:00:00+00:00", map_index=-1)
    return {"ti": ti, "dag_run": SimpleNamespace(run_type="scheduled"), "logical_date": CREATED}


@pytest.fixture
def source(tmp_path):
    for label in ("cat", "dog"):
        for i in range(3):
            path = tmp_path / "src" / label / f"{label}{i}.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{label} {i}\n")
    return tmp_path / "src"


@pytest.fixture
def file_system(local_stack, stack_name):
    """A Lustre file system on the moto server (real create, describe and delete)."""
    fsx = boto3.client("fsx")
    fs = fsx.create_file_system(
        FileSystemType="LUSTRE",
        StorageCapacity=1200,
        SubnetIds=["subnet-0123456789abcdef0"],
        LustreConfiguration={"DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": 125},
        Tags=[{"Key": "pcflow:stack", "Value": stack_name}],
    )["FileSystem"]["FileSystemId"]
    yield fs
    fsx.delete_file_system(FileSystemId=fs)


@pytest.fixture
def case(s3, bucket, source, stack_name, file_system):
    return SimpleNamespace(s3=s3, bucket=bucket, source=source, stack=stack_name, fs=file_system)


def loader(case, fs: str | None = None, **kwargs):
    return DatasetLoadOperator(
        task_id="load",
        source=str(case.source),
        bucket=case.bucket,
        prefix="datasets/pets",
        stack=case.stack,
        fsx_file_system_id=fs or case.fs,
        waiter_delay=0,
        waiter_max_attempts=3,
        **kwargs,
    )


@contextlib.contextmanager
def triggerer_sees(monkeypatch, task_id: str, *lifecycles: dict):
    """The trigger's aiobotocore client answers DescribeDataRepositoryTasks with `lifecycles`, in order."""
    original = FsxHook.get_async_conn

    async def get_async_conn(hook):
        @contextlib.asynccontextmanager
        async def stubbed():
            async with await original(hook) as client:
                with AioStubber(client) as stub:
                    for state in lifecycles:
                        task = {"TaskId": task_id, "Type": IMPORT, "CreationTime": CREATED, **state}
                        stub.add_response(
                            "describe_data_repository_tasks", {"DataRepositoryTasks": [task]}, {"TaskIds": [task_id]}
                        )
                    yield client
                    stub.assert_no_pending_responses()

        return stubbed()

    with monkeypatch.context() as patch:
        patch.setattr(FsxHook, "get_async_conn", get_async_conn)
        yield


def run_trigger(trigger: FsxDataRepositoryTaskTrigger) -> list:
    async def collect():
        return [event.payload async for event in trigger.run()]

    return asyncio.run(collect())


def test_unknown_file_system_fails_before_anything_is_uploaded(case):
    """Real moto all the way: DescribeFileSystems does not know the id."""
    with pytest.raises(ValueError, match=r"fs-0123456789abcdef0.*not found"):
        loader(case, "fs-0123456789abcdef0").execute(context())
    assert case.s3.list_objects_v2(Bucket=case.bucket).get("KeyCount", 0) == 0


def test_fsx_import_standin_starts_once_defers_and_succeeds(case, monkeypatch):
    from airflow.sdk.exceptions import TaskDeferred

    op = loader(case)
    standin = FsxStandIn(links={case.fs: [f"s3://{case.bucket}/datasets"]}).attach(op.fsx_hook.conn)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context())
    result = deferred.value.kwargs["result"]
    assert read_manifest(case.s3, case.bucket, result["root"])["object_count"] == 6, "committed before the import"
    [create] = standin.creates()
    assert create["Type"] == IMPORT and create["FileSystemId"] == case.fs
    assert create["Paths"] == [f"s3://{case.bucket}/datasets/pets/2026-11-29/"] == [result["uri"]]
    trigger = deferred.value.trigger
    assert isinstance(trigger, FsxDataRepositoryTaskTrigger)
    task_id = result["fsx_import_task_id"]
    assert trigger.serialize()[1]["task_id"] == task_id

    with triggerer_sees(monkeypatch, task_id, {"Lifecycle": "EXECUTING"}, {"Lifecycle": "SUCCEEDED"}):
        [event] = run_trigger(trigger)
    assert event == {"status": "success", "task_id": task_id}
    standin.finish(task_id, "SUCCEEDED")
    assert op.execute_complete(context(), event=event, result=result)["fsx_import_task_id"] == task_id

    # A retry of the whole task (same run): nothing uploaded again, the same import task adopted.
    with pytest.raises(TaskDeferred) as again:
        op.execute(context())
    assert again.value.kwargs["result"]["fsx_import_task_id"] == task_id and len(standin.creates()) == 1
    assert again.value.kwargs["result"]["uploaded"] == 0


def test_fsx_import_standin_failure_message_reaches_the_user(case, monkeypatch):
    from airflow.sdk.exceptions import AirflowException, TaskDeferred

    why = "Amazon FSx does not have permission to read s3://bucket/datasets: check the bucket policy"
    op = loader(case)
    standin = FsxStandIn(links={case.fs: [f"s3://{case.bucket}/datasets/pets"]}).attach(op.fsx_hook.conn)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context())
    result = deferred.value.kwargs["result"]
    task_id = result["fsx_import_task_id"]
    failed = {"Lifecycle": "FAILED", "FailureDetails": {"Message": why}}
    with triggerer_sees(monkeypatch, task_id, {"Lifecycle": "EXECUTING"}, failed):
        [event] = run_trigger(deferred.value.trigger)
    assert event["status"] == "error" and why in event["message"]
    standin.finish(task_id, "FAILED", why)
    with pytest.raises(AirflowException, match="permission to read") as err:
        op.execute_complete(context(), event=event, result=result)
    assert "manifest is committed" in str(err.value)

    # Cleared after a "fix": the retry starts a new import (the failed one is not adopted), and the
    # worker-side wait (deferrable=False) surfaces FSx's reason the same way.
    standin.ends = ("FAILED", why)
    blocking = loader(case, deferrable=False)
    standin.attach(blocking.fsx_hook.conn)
    with pytest.raises(AirflowException, match="permission to read"):
        blocking.execute(context())
    first, second = standin.creates()
    assert first["ClientRequestToken"] != second["ClientRequestToken"]
    assert [t["Lifecycle"] for t in standin.tasks.values()] == ["FAILED", "FAILED"]


def test_fsx_not_linked_to_the_prefix_standin_leaves_it_to_the_link(case):
    op = loader(case)
    standin = FsxStandIn(links={case.fs: [f"s3://{case.bucket}/other"]}).attach(op.fsx_hook.conn)
    result = op.execute(context())
    assert result["fsx_import_task_id"] is None and standin.creates() == []
    assert [op for op, _ in standin.calls] == ["DescribeDataRepositoryAssociations"]
