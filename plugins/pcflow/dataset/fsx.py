"""FSx for Lustre: make a newly loaded S3 prefix visible on a file system that is already linked.

A file system linked to the bucket at cluster creation imports the prefix's metadata then; one that
already exists only sees objects created since its last import once a data repository task
(IMPORT_METADATA_FROM_REPOSITORY) has run. The task is created with a deterministic client token (the
same load gets the same task on a retry) and awaited in the triggerer (AwsBaseWaiterTrigger + the
waiter in waiters/fsx.json), so an import of a big dataset holds no worker slot.
"""

from __future__ import annotations

import logging
from functools import cached_property
from pathlib import Path
from typing import Any

from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
from airflow.providers.amazon.aws.triggers.base import AwsBaseWaiterTrigger
from botocore.exceptions import ClientError

from pcflow.naming import aws_tags, digest

log = logging.getLogger(__name__)

IMPORT_TASK = "IMPORT_METADATA_FROM_REPOSITORY"
WAITER = "data_repository_task_complete"


class FsxHook(AwsBaseHook):
    """The FSx client, with pcflow's FSx waiters (the provider ships none for FSx)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["client_type"] = "fsx"
        super().__init__(*args, **kwargs)

    @cached_property
    def waiter_path(self) -> Path:
        return Path(__file__).with_name("waiters") / "fsx.json"


def linked_repository_paths(fsx: Any, file_system_id: str) -> list[str]:
    """S3 paths the file system is linked to: its data repository associations, or the legacy ImportPath."""
    try:
        fs = fsx.describe_file_systems(FileSystemIds=[file_system_id])["FileSystems"][0]
    except ClientError as err:
        if err.response["Error"]["Code"] == "FileSystemNotFound":
            raise ValueError(f"FSx file system {file_system_id!r} not found: check fsx_file_system_id") from err
        raise
    paths = []
    legacy = fs.get("LustreConfiguration", {}).get("DataRepositoryConfiguration", {}).get("ImportPath")
    if legacy:
        paths.append(legacy)
    else:
        kwargs: dict[str, Any] = {"Filters": [{"Name": "file-system-id", "Values": [file_system_id]}]}
        while True:  # botocore has no paginator for this operation
            page = fsx.describe_data_repository_associations(**kwargs)
            paths += [a["DataRepositoryPath"] for a in page.get("Associations", [])]
            if not page.get("NextToken"):
                break
            kwargs["NextToken"] = page["NextToken"]
    return paths


def covers(repository_path: str, s3_uri: str) -> bool:
    """Whether an S3 path linked to a file system includes `s3_uri` (prefix match on whole segments)."""
    base = repository_path.rstrip("/") + "/"
    return (s3_uri.rstrip("/") + "/").startswith(base)


def import_token(file_system_id: str, s3_uri: str, content_hash: str) -> str:
    """Same file system, prefix and content -> same token: a retried task adopts the task it created."""
    return f"pcflow-import-{digest(file_system_id, s3_uri, content_hash, length=40)}"


def start_import(fsx: Any, *, file_system_id: str, s3_uri: str, content_hash: str, tags: dict[str, str]) -> str:
    """Create (or, by client token, adopt) the import task for `s3_uri`; returns its task id."""
    resp = fsx.create_data_repository_task(
        FileSystemId=file_system_id,
        Type=IMPORT_TASK,
        Paths=[s3_uri],
        Report={"Enabled": False},
        ClientRequestToken=import_token(file_system_id, s3_uri, content_hash),
        Tags=aws_tags(tags),
    )
    return resp["DataRepositoryTask"]["TaskId"]


class FsxDataRepositoryTaskTrigger(AwsBaseWaiterTrigger):
    """Fires when an FSx data repository task ends (success, or failure with the task's status message)."""

    aws_hook_class = FsxHook

    def __init__(
        self,
        *,
        task_id: str,
        waiter_delay: int = 30,
        waiter_max_attempts: int = 240,
        aws_conn_id: str | None = "aws_default",
        region_name: str | None = None,
        verify: bool | str | None = None,
        botocore_config: dict | None = None,
    ) -> None:
        super().__init__(
            serialized_fields={"task_id": task_id},
            waiter_name=WAITER,
            waiter_args={"TaskIds": [task_id]},
            failure_message=f"FSx data repository task {task_id} did not succeed",
            status_message=f"FSx data repository task {task_id}",
            status_queries=["DataRepositoryTasks[0].Lifecycle", "DataRepositoryTasks[0].Status"],
            return_key="task_id",
            return_value=task_id,
            waiter_delay=waiter_delay,
            waiter_max_attempts=waiter_max_attempts,
            aws_conn_id=aws_conn_id,
            region_name=region_name,
            verify=verify,
            botocore_config=botocore_config,
        )
