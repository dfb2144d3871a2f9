"""Waiting on AWS: pcflow's triggers (they wait in the triggerer) and the FSx hook with pcflow's waiter.

A module of its own because it loads the Amazon provider's hooks and triggers (boto3): operators
import it only when they defer, so a DAG file declaring them parses without boto3. The triggerer
imports the triggers by class path, `pcflow.aws.waits.<class>`. A trigger's `**connection` (aws_conn_id,
region_name, verify, botocore_config) goes to the Amazon provider's AwsBaseWaiterTrigger as it is.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
from airflow.providers.amazon.aws.hooks.ec2 import EC2Hook
from airflow.providers.amazon.aws.triggers.base import AwsBaseWaiterTrigger

WAITERS = Path(__file__).parent / "waiters"


class PcflowWaiterHook(AwsBaseHook):
    """A client hook that knows pcflow's own waiters (`waiters/<service>.json`) beside botocore's."""

    @cached_property
    def waiter_path(self) -> Path | None:
        path = WAITERS / f"{self.client_type}.json"
        return path if path.is_file() else None


class FsxHook(PcflowWaiterHook):
    """FSx client hook with pcflow's custom waiter (`DataRepositoryTaskComplete`, waiters/fsx.json)."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs["client_type"] = "fsx"
        super().__init__(*args, **kwargs)


def custom_waiter(client: Any, service: str, name: str) -> Any | None:
    """pcflow's waiter `name` for a plain boto3 client (None when `waiters/<service>.json` has none)."""
    path = WAITERS / f"{service}.json"
    if not path.is_file():
        return None
    model = json.loads(path.read_text())
    if name not in model["waiters"]:
        return None
    from botocore.waiter import WaiterModel, create_waiter_with_client

    return create_waiter_with_client(name, WaiterModel(model), client)


class FsxDataRepositoryTaskTrigger(AwsBaseWaiterTrigger):
    """Waits in the triggerer until a data repository task finishes (deferrable import/export)."""

    aws_hook_class = FsxHook

    def __init__(
        self,
        *,
        task_id: str,
        waiter_delay: int = 30,
        waiter_max_attempts: int = 480,
        **connection: Any,
    ):
        super().__init__(
            serialized_fields={"task_id": task_id},
            waiter_name="DataRepositoryTaskComplete",
            waiter_args={"TaskIds": [task_id]},
            failure_message=f"FSx data repository task {task_id} failed",
            status_message="FSx data repository task",
            status_queries=[
                "DataRepositoryTasks[0].Lifecycle",
                "DataRepositoryTasks[0].Status",
                "DataRepositoryTasks[0].FailureDetails.Message",  # FSx's reason, in the triggerer's log
            ],
            return_key="task_id",
            return_value=task_id,
            waiter_delay=waiter_delay,
            waiter_max_attempts=waiter_max_attempts,
            **connection,
        )


class ImageAvailableTrigger(AwsBaseWaiterTrigger):
    """Waits in the triggerer for a new image (often longer than the 10 min of the default waiter)."""

    aws_hook_class = EC2Hook

    def __init__(
        self,
        *,
        image_id: str,
        waiter_delay: int = 30,
        waiter_max_attempts: int = 240,
        **connection: Any,
    ):
        super().__init__(
            serialized_fields={"image_id": image_id},
            waiter_name="image_available",
            waiter_args={"ImageIds": [image_id]},
            failure_message=f"image {image_id} failed",
            status_message="image state",
            status_queries=["Images[0].State"],
            return_key="image_id",
            return_value=image_id,
            waiter_delay=waiter_delay,
            waiter_max_attempts=waiter_max_attempts,
            **connection,
        )

    @property
    def _hook_parameters(self) -> dict[str, Any]:
        return {**super()._hook_parameters, "api_type": "client_type"}


class BakeWaitTrigger(AwsBaseWaiterTrigger):
    """Waits in the triggerer for one step of an AMI bake (builder running or stopped, SSM agent online,
    bootstrap command ended): a botocore waiter or pcflow's own on `service`, status logged each poll.
    A failed wait is an event with status `error`; the operator reads the reason from AWS."""

    def __init__(
        self,
        *,
        service: str,
        waiter: str,
        args: dict[str, Any],
        what: str,
        status_queries: list[str],
        waiter_delay: int = 30,
        waiter_max_attempts: int = 40,
        **connection: Any,
    ):
        super().__init__(
            serialized_fields={
                "service": service,
                "waiter": waiter,
                "args": args,
                "what": what,
                "status_queries": status_queries,
            },
            waiter_name=waiter,
            waiter_args=args,
            failure_message=f"{what} did not reach the expected state",
            status_message=what,
            status_queries=status_queries,
            return_key="waited",
            return_value={"waiter": waiter, **args},
            waiter_delay=waiter_delay,
            waiter_max_attempts=waiter_max_attempts,
            **connection,
        )
        self.service = service

    def hook(self) -> PcflowWaiterHook:
        return PcflowWaiterHook(client_type=self.service, **self._hook_parameters)


class LockReleasedTrigger(AwsBaseWaiterTrigger):
    """Waits in the triggerer while another run holds a pcflow lock (`pcflow.aws.locks.S3Lock`): it fires
    once the lock object is gone (released) or is no longer the one seen (its ETag changed: taken over, or
    released and taken again), with pcflow's waiter `LockReleased` (HeadObject with `If-Match`: 404 or 412
    end the wait). The operator then tries the lock again; it does not take it here. Bounded: after
    `waiter_max_attempts` polls the event is an error, and the operator looks again (a lock gone stale
    meanwhile is broken then)."""

    def __init__(
        self,
        *,
        bucket: str,
        key: str,
        etag: str,
        holder: str = "",
        waiter_delay: int = 15,
        waiter_max_attempts: int = 240,
        **connection: Any,
    ):
        super().__init__(
            serialized_fields={"bucket": bucket, "key": key, "etag": etag, "holder": holder},
            waiter_name="LockReleased",
            waiter_args={"Bucket": bucket, "Key": key, **({"IfMatch": etag} if etag else {})},
            failure_message=f"lock s3://{bucket}/{key} (held by {holder or 'unknown'})",
            status_message=f"lock s3://{bucket}/{key} held by {holder or 'unknown'}, last modified",
            status_queries=["LastModified"],
            return_key="lock",
            return_value={"bucket": bucket, "key": key, "holder": holder},
            waiter_delay=waiter_delay,
            waiter_max_attempts=waiter_max_attempts,
            **connection,
        )

    def hook(self) -> PcflowWaiterHook:
        return PcflowWaiterHook(client_type="s3", **self._hook_parameters)
