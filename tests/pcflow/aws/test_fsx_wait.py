"""The one wait for an FSx data repository task (`pcflow.aws.storage.await_data_repository_task`), as both
of its callers use it: the export/import operator and the dataset load. No stack: botocore's Stubber
answers on the operators' own clients (the moto server has no data repository tasks anyway)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import TaskDeferred
from botocore.stub import ANY, Stubber

from pcflow.aws.storage import DataRepositoryTaskFailed, FsxDataRepositoryTaskOperator, await_data_repository_task
from pcflow.dataset.operators import DatasetLoadOperator
from pcflow.errors import ServiceFailed

TASK_ID = "task-0123456789abcdef0"
FS_ID = "fs-0123456789abcdef0"
CONNECTION = {"aws_conn_id": None, "region_name": "eu-west-1"}
CALLERS = {
    FsxDataRepositoryTaskOperator: {"file_system_id": FS_ID, "task_type": "export", "task_name": "export"},
    DatasetLoadOperator: {
        "source": "/data",
        "bucket": "b",
        "prefix": "datasets/x",
        "stack": "s",
        "fsx_file_system_id": FS_ID,
    },
}
BY_ID = {"TaskIds": [TASK_ID]}
CREATE = {"Type": ANY, "FileSystemId": FS_ID, "Report": ANY, "ClientRequestToken": ANY, "Tags": ANY}


def task(lifecycle: str, **extra) -> dict:
    return {
        "TaskId": TASK_ID,
        "Lifecycle": lifecycle,
        "Type": "EXPORT_TO_REPOSITORY",
        "CreationTime": "2026-01-01T00:00:00Z",
        **extra,
    }


def described(*tasks: dict) -> dict:
    return {"DataRepositoryTasks": list(tasks)}


def context() -> dict:
    ti = SimpleNamespace(dag_id="pretrain_nightly", run_id="manual__2026-11-29T00:00:00+00:00", map_index=-1)
    return {"ti": ti, "dag_run": SimpleNamespace(run_type="manual")}


@pytest.mark.parametrize("caller", CALLERS)
def test_the_deferred_wait_carries_the_operators_connection(caller):
    legacy = {"connect_timeout": 7, "retries": {"mode": "legacy", "max_attempts": 3}}
    op = caller(task_id="t", botocore_config=legacy, **CONNECTION, **CALLERS[caller])
    with pytest.raises(TaskDeferred) as deferred:
        await_data_repository_task(op, TASK_ID, deferrable=True, delay=5, max_attempts=9, resume_kwargs={"result": 1})
    assert deferred.value.method_name == "execute_complete" and deferred.value.kwargs == {"result": 1}
    path, kwargs = deferred.value.trigger.serialize()
    assert path == "pcflow.aws.waits.FsxDataRepositoryTaskTrigger"
    assert (kwargs["task_id"], kwargs["waiter_delay"], kwargs["waiter_max_attempts"]) == (TASK_ID, 5, 9)
    assert kwargs["region_name"] == "eu-west-1" and kwargs["aws_conn_id"] is None
    config = kwargs["botocore_config"]
    assert config["connect_timeout"] == 7 and config["retries"] == {"mode": "standard", "max_attempts": 3}
    assert op.client("fsx").meta.config.retries["mode"] == "standard"  # the worker's wait: the same retries


@pytest.mark.parametrize("caller", CALLERS)
def test_the_worker_wait_returns_the_result_or_raises_fsxs_reason(caller):
    op = caller(task_id="t", **CONNECTION, **CALLERS[caller])
    failed = task("FAILED", FailureDetails={"Message": "access denied to bucket"})
    with Stubber(op.client("fsx")) as stub:
        for answer in (task("SUCCEEDED"), task("SUCCEEDED"), failed, failed):  # the waiter's call, then the result's
            stub.add_response("describe_data_repository_tasks", described(answer), BY_ID)
        result = await_data_repository_task(op, TASK_ID, deferrable=False, delay=1, max_attempts=2)
        assert result == {"task_id": TASK_ID, "lifecycle": "SUCCEEDED", "status": {}}
        with pytest.raises(DataRepositoryTaskFailed, match="access denied to bucket"):
            await_data_repository_task(op, TASK_ID, deferrable=False, delay=1, max_attempts=2)
        stub.assert_no_pending_responses()


def test_the_export_operator_starts_then_defers_on_its_connection():
    caller = FsxDataRepositoryTaskOperator
    op = caller(task_id="t", deferrable=True, **CONNECTION, **CALLERS[caller])
    with Stubber(op.client("fsx")) as stub:
        stub.add_response("describe_data_repository_tasks", described(), {"Filters": ANY})
        stub.add_response("create_data_repository_task", {"DataRepositoryTask": task("PENDING")}, CREATE)
        with pytest.raises(TaskDeferred) as deferred:
            op.execute(context())
        stub.assert_no_pending_responses()
    assert deferred.value.trigger.serialize()[1]["task_id"] == TASK_ID and deferred.value.kwargs is None


def test_the_dataset_load_explains_a_failed_import_in_the_worker():
    op = DatasetLoadOperator(task_id="t", deferrable=False, **CONNECTION, **CALLERS[DatasetLoadOperator])
    result = {"uri": "s3://b/datasets/x/p/", "content_hash": "abc"}
    failed = task("FAILED", FailureDetails={"Message": "no permission to read s3://b"})
    with Stubber(op.client("fsx")) as stub:
        stub.add_response("describe_data_repository_tasks", described(), {"Filters": ANY})
        created = {"DataRepositoryTask": task("PENDING")}
        stub.add_response("create_data_repository_task", created, {**CREATE, "Paths": [result["uri"]]})
        stub.add_response("describe_data_repository_tasks", described(failed), BY_ID)  # the waiter's call
        stub.add_response("describe_data_repository_tasks", described(failed), BY_ID)  # the result's
        with pytest.raises(ServiceFailed, match=r"no permission to read.*manifest is committed"):
            op._import_into_fsx(result, {"pcflow:stack": "s"}, ["s3://b/datasets"])
        stub.assert_no_pending_responses()
    assert result["fsx_import_task_id"] == TASK_ID
