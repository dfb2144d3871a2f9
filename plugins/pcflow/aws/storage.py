"""Storage: the S3 bucket a stack keeps datasets and results in, and FSx for Lustre data repository tasks.

`ensure_bucket` creates a bucket with pcflow's settings (Block Public Access, default encryption,
ownership controls, versioning, lifecycle rules, tags), or adopts one this account already owns in the
right region without changing it: what pcflow needs and the bucket lacks is refused, the rest reported
(`pcflow.aws.buckets`). A name owned by someone else, or a bucket in another region, is refused with a
message saying what to change. `ensure_shared_bucket` is the dataset bucket stacks share.

FSx data repository tasks import S3 changes into an existing file system before training and export
results to S3 before the file system is deleted. The moto server (5.2.5, the newest release) answers
500 for these APIs, so their tests use botocore's Stubber (tests/pcflow/aws/test_storage.py,
tests/pcflow/dataset/test_fsx_import.py); the calls follow the FSx API reference.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import conf

from pcflow.aws.base import PcflowAwsOperator, aws_template_fields
from pcflow.aws.buckets import (
    adoption_differences,
    bucket_tags,
    bucket_users,
    check_adoptable,
    creation_unfinished,
    register_bucket_user,
)
from pcflow.aws.clients import error_code, validate_region, wait_logged
from pcflow.errors import ConfigurationError, ResourceConflict, ServiceFailed
from pcflow.events import validate_event
from pcflow.naming import aws_tags, digest

BUCKET_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
PUBLIC_ACCESS_BLOCKED = {
    "BlockPublicAcls": True,
    "IgnorePublicAcls": True,
    "BlockPublicPolicy": True,
    "RestrictPublicBuckets": True,
}


class BucketUnavailable(ResourceConflict):
    """The bucket name cannot be used by this account in this region."""


def validate_bucket_name(name: str) -> str:
    """The name when S3 would accept it (the naming rules, no IP address, no reserved prefix or suffix); refused
    here with the rule, before any call."""
    if (
        not isinstance(name, str)
        or not BUCKET_NAME_RE.fullmatch(name)
        or ".." in name
        or ".-" in name
        or "-." in name
        or _is_ip(name)
        or name.startswith("xn--")
        or name.endswith("-s3alias")
    ):
        raise ConfigurationError(
            f"invalid S3 bucket name {name!r}: use 3-63 lower-case letters, digits, hyphens and dots, "
            "starting and ending with a letter or digit (see the S3 bucket naming rules)"
        )
    return name


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _owned_bucket_region(s3: Any, name: str) -> str | None:
    """The region of `name` if this account owns it, else None (ListBuckets only shows own buckets)."""
    for page in s3.get_paginator("list_buckets").paginate(Prefix=name):
        if any(b["Name"] == name for b in page.get("Buckets", [])):
            location = s3.get_bucket_location(Bucket=name).get("LocationConstraint")
            return {None: "us-east-1", "": "us-east-1", "EU": "eu-west-1"}.get(location, location)
    return None


#: The parts of a multipart upload killed half way (a crashed load) cost storage until aborted: S3
#: aborts them after two days, which no resumed load needs.
ABORT_INCOMPLETE_UPLOADS = {
    "ID": "pcflow-abort-incomplete-uploads",
    "Status": "Enabled",
    "Filter": {"Prefix": ""},
    "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 2},
}
#: In a versioned dataset bucket, a replaced object stays readable (by the manifests that list it) a week.
EXPIRE_REPLACED_VERSIONS = {
    "ID": "pcflow-expire-replaced-versions",
    "Status": "Enabled",
    "Filter": {"Prefix": ""},
    "NoncurrentVersionExpiration": {"NoncurrentDays": 7},
    "Expiration": {"ExpiredObjectDeleteMarker": True},
}


def ensure_bucket(
    s3: Any,
    name: str,
    *,
    region: str,
    tags: Mapping[str, str],
    versioning: bool = False,
    lifecycle_rules: Sequence[Mapping[str, Any]] | None = None,
    kms_key_id: str | None = None,
) -> dict[str, Any]:
    """Create `name` with pcflow's settings, or adopt it as it is; returns `{"bucket", "region",
    "created", "differences"}`.

    A bucket that already exists is not pcflow's to change: its settings are read, a bucket without
    what pcflow needs (versioning when asked, Block Public Access) is refused with the command that
    fixes it, and other differences are reported (`pcflow.aws.buckets`). Its tags are left as they are.
    Only a creation a crash interrupted (tagged, public access not yet blocked) is finished.
    """

    validate_bucket_name(name)
    validate_region(region)
    owned_region = _owned_bucket_region(s3, name)
    if owned_region is not None and owned_region != region:
        raise BucketUnavailable(
            f"bucket {name} already exists in your account in {owned_region}, not {region}; "
            f"use region {owned_region} or another bucket name"
        )
    created = owned_region is None and _create_bucket(s3, name, region)
    result = {"bucket": name, "region": region, "created": created, "differences": []}
    if created or creation_unfinished(s3, name):
        _apply_settings(
            s3, name, tags=tags, versioning=versioning, lifecycle_rules=lifecycle_rules or (), kms_key_id=kms_key_id
        )
        return result
    differences = adoption_differences(
        s3, name, versioning=versioning, lifecycle_rules=lifecycle_rules or (), kms_key_id=kms_key_id
    )
    return {**result, "differences": check_adoptable(s3, name, differences)}


def _create_bucket(s3: Any, name: str, region: str) -> bool:
    from botocore.exceptions import ClientError

    kwargs: dict[str, Any] = {"Bucket": name}
    if region != "us-east-1":
        kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
    try:
        s3.create_bucket(**kwargs)
    except ClientError as error:
        if error_code(error) == "BucketAlreadyExists":
            raise BucketUnavailable(
                f"bucket name {name} is taken by another AWS account (S3 names are global); choose another name"
            ) from None
        if error_code(error) != "BucketAlreadyOwnedByYou":
            raise
        return False
    return True


def _apply_settings(
    s3: Any,
    name: str,
    *,
    tags: Mapping[str, str],
    versioning: bool,
    lifecycle_rules: Sequence[Mapping[str, Any]],
    kms_key_id: str | None,
) -> None:
    """pcflow's settings on a bucket it created: tags first (so a crash leaves it recognisably pcflow's),
    Block Public Access last (so its absence marks an unfinished creation)."""
    s3.put_bucket_tagging(Bucket=name, Tagging={"TagSet": aws_tags({**bucket_tags(s3, name), **tags})})
    s3.put_bucket_ownership_controls(
        Bucket=name, OwnershipControls={"Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]}
    )
    sse: dict[str, Any] = (
        {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": kms_key_id} if kms_key_id else {"SSEAlgorithm": "AES256"}
    )
    s3.put_bucket_encryption(
        Bucket=name,
        ServerSideEncryptionConfiguration={
            "Rules": [{"ApplyServerSideEncryptionByDefault": sse, "BucketKeyEnabled": bool(kms_key_id)}]
        },
    )
    if versioning:
        s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    if lifecycle_rules:
        current = _lifecycle_rules(s3, name)
        ours = {rule["ID"] for rule in lifecycle_rules}
        merged = [rule for rule in current if rule.get("ID") not in ours] + [dict(r) for r in lifecycle_rules]
        if merged != current:
            s3.put_bucket_lifecycle_configuration(Bucket=name, LifecycleConfiguration={"Rules": merged})
    s3.put_public_access_block(Bucket=name, PublicAccessBlockConfiguration=PUBLIC_ACCESS_BLOCKED)


def ensure_shared_bucket(
    s3: Any,
    name: str,
    *,
    region: str,
    stack: str,
    versioning: bool = False,
    lifecycle_rules: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """A bucket stacks share (the dataset bucket): created tagged as shared (no owning stack), adopted
    as it is, and `stack` recorded as one of its users, so removing another stack never deletes it."""
    from pcflow.naming import Component, shared_tags

    tags = shared_tags(created_by=stack, component=Component.STORAGE)
    result = ensure_bucket(s3, name, region=region, tags=tags, versioning=versioning, lifecycle_rules=lifecycle_rules)
    register_bucket_user(s3, name, stack)
    return {**result, "users": bucket_users(s3, name)}


def _lifecycle_rules(s3: Any, name: str) -> list[dict[str, Any]]:
    from botocore.exceptions import ClientError

    try:
        return s3.get_bucket_lifecycle_configuration(Bucket=name)["Rules"]
    except ClientError as error:
        if error_code(error) == "NoSuchLifecycleConfiguration":
            return []
        raise


# --- FSx for Lustre data repository tasks -------------------------------------------------------

TASK_TYPES = {
    "import": "IMPORT_METADATA_FROM_REPOSITORY",
    "export": "EXPORT_TO_REPOSITORY",
}
ACTIVE = ("PENDING", "EXECUTING", "CANCELING")
TASK_KEY_TAG = "pcflow:task-key"


class DataRepositoryTaskFailed(ServiceFailed):
    """An FSx import or export ended other than SUCCEEDED; FSx's reason is in the message."""


def start_data_repository_task(
    fsx: Any,
    *,
    file_system_id: str,
    task_type: str,
    task_key: str,
    paths: Sequence[str] = (),
    report_path: str | None = None,
    tags: Mapping[str, str] | None = None,
) -> str:
    """Start (or find the already started) import/export task for `task_key`; returns its task id.

    `task_key` identifies the logical task (e.g. run key + "export-results"): a running or succeeded
    task carrying it is adopted, and the create call's ClientRequestToken is derived from it, so an
    Airflow retry never starts a second copy. A failed or canceled one is not: the retry that follows
    a fix starts a new task (its token counts the failed ones, so it is still deterministic).
    """
    if task_type not in TASK_TYPES:
        raise ConfigurationError(f"task_type must be one of {sorted(TASK_TYPES)}, not {task_type!r}")
    filters = [{"Name": "file-system-id", "Values": [file_system_id]}]
    kwargs: dict[str, Any] = {"Filters": filters}
    ended_badly = 0
    while True:  # botocore has no paginator for this operation
        page = fsx.describe_data_repository_tasks(**kwargs)
        for task in page.get("DataRepositoryTasks", []):
            if {t["Key"]: t["Value"] for t in task.get("Tags", [])}.get(TASK_KEY_TAG) != task_key:
                continue
            if task["Lifecycle"] in ("FAILED", "CANCELED"):
                ended_badly += 1
                continue
            return task["TaskId"]
        if not page.get("NextToken"):
            break
        kwargs["NextToken"] = page["NextToken"]
    attempt = (str(ended_badly),) if ended_badly else ()
    report: dict[str, Any] = {"Enabled": False}
    if report_path:
        report = {"Enabled": True, "Path": report_path, "Format": "REPORT_CSV_20191124", "Scope": "FAILED_FILES_ONLY"}
    kwargs = {
        "Type": TASK_TYPES[task_type],
        "FileSystemId": file_system_id,
        "Report": report,
        "ClientRequestToken": f"pcflow-{digest(file_system_id, task_type, task_key, *attempt, length=40)}",
        "Tags": aws_tags({**(tags or {}), TASK_KEY_TAG: task_key}),
    }
    if paths:
        kwargs["Paths"] = list(paths)
    from botocore.exceptions import ClientError

    try:
        return fsx.create_data_repository_task(**kwargs)["DataRepositoryTask"]["TaskId"]
    except ClientError as error:
        if error_code(error) == "DataRepositoryTaskExecuting":
            raise DataRepositoryTaskFailed(
                f"another data repository task is running on FSx {file_system_id} (FSx runs one at a time): "
                "let it finish, then retry this task; it starts the import then"
            ) from error
        raise


#: The task name of the export a cluster's delete runs first (task key `<run key or cluster>/<this>`).
EXPORT_BEFORE_DELETE = "export-before-delete"


def last_export_before_delete(fsx: Any, file_system_id: str) -> dict[str, Any] | None:
    """The newest export-before-delete task of a file system (any run's), None when there was none."""
    kwargs: dict[str, Any] = {"Filters": [{"Name": "file-system-id", "Values": [file_system_id]}]}
    found: list[dict[str, Any]] = []
    while True:  # botocore has no paginator for this operation
        page = fsx.describe_data_repository_tasks(**kwargs)
        for task in page.get("DataRepositoryTasks", []):
            key = {t["Key"]: t["Value"] for t in task.get("Tags", [])}.get(TASK_KEY_TAG, "")
            if key.endswith(f"/{EXPORT_BEFORE_DELETE}"):
                found.append(task)
        if not page.get("NextToken"):
            break
        kwargs["NextToken"] = page["NextToken"]
    return max(found, key=lambda t: (t.get("CreationTime") or 0, t["TaskId"]), default=None)


def data_repository_task_result(fsx: Any, task_id: str) -> dict[str, Any]:
    """The finished task's status; raises with FSx's failure details when it did not succeed."""
    task = fsx.describe_data_repository_tasks(TaskIds=[task_id])["DataRepositoryTasks"][0]
    if task["Lifecycle"] in ACTIVE:
        raise DataRepositoryTaskFailed(
            f"FSx data repository task {task_id} is still {task['Lifecycle']} after the wait; it keeps running "
            "in FSx: clear this Airflow task to wait for it again (the retry adopts it), or raise waiter_max_attempts"
        )
    if task["Lifecycle"] != "SUCCEEDED":
        details = task.get("FailureDetails", {}).get("Message", "no details")
        raise DataRepositoryTaskFailed(
            f"FSx data repository task {task_id} ended {task['Lifecycle']}: {details}; see the task report "
            "in the S3 repository for the files that failed"
        )
    return {"task_id": task_id, "lifecycle": task["Lifecycle"], "status": task.get("Status", {})}


def wait_for_data_repository_task(fsx: Any, waiter: Any, task_id: str, *, delay: int, max_attempts: int) -> dict:
    """Wait in the worker (the non-deferrable path); returns the result, or raises with FSx's own reason."""
    try:
        wait_logged(
            waiter,
            {"TaskIds": [task_id]},
            what=f"FSx task {task_id}",
            status_args=["DataRepositoryTasks[0].Lifecycle", "DataRepositoryTasks[0].FailureDetails.Message"],
            delay=delay,
            max_attempts=max_attempts,
        )
    except Exception:  # the waiter's failure state or its timeout: the task itself says which, and why
        data_repository_task_result(fsx, task_id)
        raise
    return data_repository_task_result(fsx, task_id)


def await_data_repository_task(
    operator: PcflowAwsOperator,
    task_id: str,
    *,
    deferrable: bool,
    delay: int,
    max_attempts: int,
    resume_kwargs: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Wait for a started import/export the way every FSx caller does (the export operator, the dataset
    load): deferred to the triggerer, the operator resuming in `execute_complete` with `resume_kwargs`;
    else in the worker, returning the task's result or raising FSx's own reason (DataRepositoryTaskFailed).

    Both waits use the operator's one connection: its retrying `client("fsx")` in the worker and its
    `trigger_aws_kwargs` in the triggerer (region resolved in the worker, retry mode forced), so the
    triggerer asks the same region with the same retries as the worker would.
    """
    from pcflow.aws.waits import FsxDataRepositoryTaskTrigger, custom_waiter

    if deferrable:
        operator.defer(
            trigger=FsxDataRepositoryTaskTrigger(
                task_id=task_id,
                waiter_delay=delay,
                waiter_max_attempts=max_attempts,
                **operator.trigger_aws_kwargs,
            ),
            method_name="execute_complete",
            kwargs=dict(resume_kwargs) if resume_kwargs is not None else None,
        )
    fsx = operator.client("fsx")
    waiter = custom_waiter(fsx, "fsx", "DataRepositoryTaskComplete")
    return wait_for_data_repository_task(fsx, waiter, task_id, delay=delay, max_attempts=max_attempts)


class FsxDataRepositoryTaskOperator(PcflowAwsOperator):
    """Import from / export to the file system's S3 repository; deferrable wait. Returns the task's status.

    :param task_type: `import` (before training, when the file system already existed) or `export`
        (results to S3 before the cluster and its file system are deleted).
    :param task_name: the logical task within the run (the run key is added), e.g. `export-results`.
    """

    template_fields: Sequence[str] = aws_template_fields("file_system_id", "paths", "report_path")

    def __init__(
        self,
        *,
        file_system_id: str,
        task_type: str,
        task_name: str,
        paths: Sequence[str] = (),
        report_path: str | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        waiter_delay: int = 30,
        waiter_max_attempts: int = 480,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if task_type not in TASK_TYPES:
            raise ConfigurationError(f"task_type must be one of {sorted(TASK_TYPES)}, not {task_type!r}")
        self.file_system_id = file_system_id
        self.repository_task_type = task_type  # `task_type` is BaseOperator's (the class name)
        self.task_name = task_name
        self.paths = paths
        self.report_path = report_path
        self.deferrable = deferrable
        self.waiter_delay = waiter_delay
        self.waiter_max_attempts = waiter_max_attempts

    @property
    def fsx(self) -> Any:
        return self.client("fsx")

    def execute(self, context: Any) -> dict[str, Any]:
        from pcflow.naming import run_key_from_context

        task_id = start_data_repository_task(
            self.fsx,
            file_system_id=self.file_system_id,
            task_type=self.repository_task_type,
            task_key=f"{run_key_from_context(context)}/{self.task_name}",
            paths=self.paths,
            report_path=self.report_path,
        )
        self.log.info("FSx %s task %s on %s", self.repository_task_type, task_id, self.file_system_id)
        return await_data_repository_task(
            self, task_id, deferrable=self.deferrable, delay=self.waiter_delay, max_attempts=self.waiter_max_attempts
        )

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """Whatever the wait's status, FSx itself says whether the task succeeded (and why not)."""
        event = validate_event(event, task=self.task_id, required=("task_id",))
        return data_repository_task_result(self.fsx, event["task_id"])
