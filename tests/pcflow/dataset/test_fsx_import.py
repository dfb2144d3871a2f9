"""FSx import of a newly loaded prefix into a file system that is already linked to the bucket.

Real as far as the emulator goes: the dataset goes into S3 on the local stack's moto server, and the
file system is created and described there. moto 5.2.5 implements neither data repository associations
nor data repository tasks (it answers 500), so the local stack's moto server answers them with its FSx
STAND-IN (include/local/moto_standins.py, following the FSx API reference): botocore validates every
request and response against the FSx service model, the tasks go PENDING, EXECUTING, SUCCEEDED (or
FAILED, when a test tells the stand-in so), and an import copies the objects into the directory the
local nodes see at /fsx. The triggerer's wait runs the real trigger (aiobotocore) against it. Tests
that depend on the stand-in carry `standin` in their names.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from types import SimpleNamespace

import boto3
import pytest
from stacktools import tell_standin

from pcflow.aws.waits import FsxDataRepositoryTaskTrigger
from pcflow.dataset.manifest import read_manifest
from pcflow.dataset.operators import DatasetLoadOperator

pytestmark = pytest.mark.stack
IMPORT = "IMPORT_METADATA_FROM_REPOSITORY"
LOGICAL_DATE = dt.datetime(2026, 11, 29, tzinfo=dt.UTC)


def context():
    ti = SimpleNamespace(dag_id="pretrain_nightly", run_id="scheduled__2026-11-29T00:00:00+00:00", map_index=-1)
    return {"ti": ti, "dag_run": SimpleNamespace(run_type="scheduled"), "logical_date": LOGICAL_DATE}


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


def link(case, s3_path: str) -> None:
    """A data repository association (the stand-in's): the file system's root is `s3_path`."""
    boto3.client("fsx").create_data_repository_association(
        FileSystemId=case.fs, FileSystemPath="/", DataRepositoryPath=s3_path
    )


def import_tasks(case) -> list[dict]:
    filters = [{"Name": "file-system-id", "Values": [case.fs]}]
    return boto3.client("fsx").describe_data_repository_tasks(Filters=filters)["DataRepositoryTasks"]


def loader(case, fs: str | None = None, **kwargs):
    return DatasetLoadOperator(
        task_id="load",
        source=str(case.source),
        bucket=case.bucket,
        prefix="datasets/pets",
        stack=case.stack,
        fsx_file_system_id=fs or case.fs,
        waiter_delay=1,
        waiter_max_attempts=20,
        **kwargs,
    )


def run_trigger(trigger: FsxDataRepositoryTaskTrigger) -> list:
    async def collect():
        return [event.payload async for event in trigger.run()]

    return asyncio.run(collect())


def test_unknown_file_system_fails_before_anything_is_uploaded(case):
    """Real moto all the way: DescribeFileSystems does not know the id."""
    with pytest.raises(ValueError, match=r"fs-0123456789abcdef0.*not found"):
        loader(case, "fs-0123456789abcdef0").execute(context())
    assert case.s3.list_objects_v2(Bucket=case.bucket).get("KeyCount", 0) == 0


def test_fsx_import_standin_starts_once_defers_and_succeeds(case, local_stack):
    from airflow.sdk.exceptions import TaskDeferred

    link(case, f"s3://{case.bucket}/datasets")
    op = loader(case)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context())
    result = deferred.value.kwargs["result"]
    assert read_manifest(case.s3, case.bucket, result["root"])["object_count"] == 6, "committed before the import"
    [task] = import_tasks(case)
    assert task["Type"] == IMPORT and task["Paths"] == [f"s3://{case.bucket}/datasets/pets/2026-11-29/"]
    assert task["Paths"] == [result["uri"]] and task["TaskId"] == result["fsx_import_task_id"]
    trigger = deferred.value.trigger
    assert isinstance(trigger, FsxDataRepositoryTaskTrigger)
    assert trigger.serialize()[1]["task_id"] == task["TaskId"]

    [event] = run_trigger(trigger)  # the triggerer's wait, on FSx's answers
    assert event == {"status": "success", "task_id": task["TaskId"]}
    assert op.execute_complete(context(), event=event, result=result)["fsx_import_task_id"] == task["TaskId"]
    mounted = local_stack.state_dir / "fsx" / "pets" / "2026-11-29" / "cat" / "cat1.txt"
    assert mounted.read_text() == "cat 1\n"  # what the nodes see at /fsx/pets/2026-11-29/cat/cat1.txt

    # A retry of the whole task (same run): nothing uploaded again, the same import task adopted.
    with pytest.raises(TaskDeferred) as again:
        op.execute(context())
    assert again.value.kwargs["result"]["fsx_import_task_id"] == task["TaskId"] and len(import_tasks(case)) == 1
    assert again.value.kwargs["result"]["uploaded"] == 0


def test_fsx_import_standin_failure_message_reaches_the_user(case, local_stack):
    from airflow.sdk.exceptions import AirflowException, TaskDeferred

    why = "Amazon FSx does not have permission to read s3://bucket/datasets: check the bucket policy"
    link(case, f"s3://{case.bucket}/datasets/pets")
    tell_standin(local_stack, "fsx/task-outcomes", {"results": [{"Lifecycle": "FAILED", "Message": why}] * 2})
    op = loader(case)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context())
    result = deferred.value.kwargs["result"]
    [event] = run_trigger(deferred.value.trigger)
    assert event["status"] == "error" and why in event["message"]
    with pytest.raises(AirflowException, match="permission to read") as err:
        op.execute_complete(context(), event=event, result=result)
    assert "manifest is committed" in str(err.value)

    # Cleared after a "fix": the retry starts a new import (the failed one is not adopted), and the
    # worker-side wait (deferrable=False) surfaces FSx's reason the same way.
    with pytest.raises(AirflowException, match="permission to read"):
        loader(case, deferrable=False).execute(context())
    assert [t["Lifecycle"] for t in import_tasks(case)] == ["FAILED", "FAILED"]


def test_fsx_not_linked_to_the_prefix_standin_leaves_it_to_the_link(case):
    link(case, f"s3://{case.bucket}/other")
    result = loader(case).execute(context())
    assert result["fsx_import_task_id"] is None and import_tasks(case) == []


@pytest.mark.security
def test_fsx_import_standin_gives_the_partition_to_the_ssh_user_alone(case, local_stack):
    """dataset.fsx_owner: every object carries the POSIX metadata FSx imports (pcflow.dataset.posix), the
    partition a directory object of its own, 0700: on the cluster the partition is its owner's alone, so
    a job reads it only through its run's view. Loaded again for another owner, every object is written
    again (the metadata is part of what is loaded)."""
    uid, gid = 2957, 2957  # any numbers: the stand-in, like FSx, gives what the metadata says
    link(case, f"s3://{case.bucket}/datasets")
    op = loader(case, deferrable=False, fsx_owner={"uid": uid, "gid": gid})
    result = op.execute(context())
    assert result["uploaded"] == 6
    head = case.s3.head_object(Bucket=case.bucket, Key=result["root"] + "cat/cat1.txt")
    assert head["Metadata"] == {"file-permissions": "0100644", "file-owner": str(uid), "file-group": str(gid)}
    directory = case.s3.head_object(Bucket=case.bucket, Key=result["root"])
    assert directory["Metadata"]["file-permissions"] == "040700" and directory["ContentLength"] == 0
    partition = local_stack.state_dir / "fsx" / "pets" / "2026-11-29"
    stat = partition.stat()
    assert (oct(stat.st_mode & 0o7777), stat.st_uid, stat.st_gid) == ("0o700", uid, gid)
    mounted = (partition / "cat" / "cat1.txt").stat()
    assert (oct(mounted.st_mode & 0o7777), mounted.st_uid) == ("0o644", uid)

    again = loader(case, deferrable=False, fsx_owner={"uid": uid, "gid": gid}).execute(context())
    assert again["uploaded"] == 0  # the same owner: nothing written twice
    other = loader(case, deferrable=False, fsx_owner={"uid": uid - 1, "gid": gid - 1}).execute(context())
    assert other["uploaded"] == 6
    plain = loader(case, deferrable=False).execute(context())  # no owner (the local profile): no metadata
    assert plain["uploaded"] == 6
    assert case.s3.head_object(Bucket=case.bucket, Key=result["root"] + "cat/cat1.txt")["Metadata"] == {}
