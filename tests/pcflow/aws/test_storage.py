"""Bucket ensure against the moto server; FSx data repository tasks with botocore's Stubber, because
the moto server answers 500 for DescribeDataRepositoryTasks/CreateDataRepositoryTask (emulator limit)."""

from __future__ import annotations

import uuid

import pytest
from botocore.stub import ANY, Stubber

from pcflow.aws.clients import aws_client
from pcflow.aws.storage import (
    ABORT_INCOMPLETE_UPLOADS,
    BucketUnavailable,
    DataRepositoryTaskFailed,
    FsxDataRepositoryTaskOperator,
    data_repository_task_result,
    ensure_bucket,
    start_data_repository_task,
)
from pcflow.aws.waits import FsxDataRepositoryTaskTrigger

pytestmark = pytest.mark.stack
TAGS = {"pcflow:stack": "storage-test", "pcflow:component": "storage"}


@pytest.fixture
def bucket_name(aws):
    names = []

    def make(prefix: str = "pcflow-t") -> str:
        names.append(f"{prefix}-{uuid.uuid4().hex[:12]}")
        return names[-1]

    yield make
    for name in names:
        for region in ("us-east-1", "eu-west-1"):
            try:
                aws_client("s3", region_name=region).delete_bucket(Bucket=name)
            except Exception:  # not created in that region / by this account
                pass


def test_ensure_bucket_twice_applies_settings_and_creates_once(aws, bucket_name):
    name = bucket_name()
    rules = [{"ID": "expire-tmp", "Status": "Enabled", "Filter": {"Prefix": "tmp/"}, "Expiration": {"Days": 7}}]
    first = ensure_bucket(aws.s3, name, region="us-east-1", tags=TAGS, versioning=True, lifecycle_rules=rules)
    second = ensure_bucket(aws.s3, name, region="us-east-1", tags=TAGS, versioning=True, lifecycle_rules=rules)
    assert first["created"] is True and second["created"] is False
    assert sum(b["Name"] == name for b in aws.s3.list_buckets()["Buckets"]) == 1
    block = aws.s3.get_public_access_block(Bucket=name)["PublicAccessBlockConfiguration"]
    assert all(block.values())
    sse = aws.s3.get_bucket_encryption(Bucket=name)["ServerSideEncryptionConfiguration"]["Rules"][0]
    assert sse["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"
    assert aws.s3.get_bucket_versioning(Bucket=name)["Status"] == "Enabled"
    assert aws.s3.get_bucket_lifecycle_configuration(Bucket=name)["Rules"][0]["ID"] == "expire-tmp"
    assert second["differences"] == []
    # Adopted with a rule of pcflow's it lacks: reported, not added (the bucket is not pcflow's to change).
    third = ensure_bucket(aws.s3, name, region="us-east-1", tags=TAGS, lifecycle_rules=[ABORT_INCOMPLETE_UPLOADS])
    assert [d.split(":")[0] for d in third["differences"]] == ["lifecycle rules"]
    ids = [rule["ID"] for rule in aws.s3.get_bucket_lifecycle_configuration(Bucket=name)["Rules"]]
    assert ids == ["expire-tmp"]
    tags = {t["Key"]: t["Value"] for t in aws.s3.get_bucket_tagging(Bucket=name)["TagSet"]}
    assert tags == TAGS


def test_bucket_in_another_region_is_refused(aws, bucket_name):
    name = bucket_name()
    eu = aws_client("s3", region_name="eu-west-1")
    eu.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    with pytest.raises(BucketUnavailable, match="already exists in your account in eu-west-1"):
        ensure_bucket(aws.s3, name, region="us-east-1", tags=TAGS)


def test_bucket_owned_by_another_account_is_refused(aws, bucket_name):
    name = bucket_name()
    creds = aws.sts.assume_role(RoleArn="arn:aws:iam::111111111111:role/other", RoleSessionName="other")["Credentials"]
    import boto3

    other = boto3.client(
        "s3",
        aws_access_key_id=creds["AccessKeyId"],
        aws_secret_access_key=creds["SecretAccessKey"],
        aws_session_token=creds["SessionToken"],
    )
    other.create_bucket(Bucket=name)
    try:
        with pytest.raises(BucketUnavailable, match="taken by another AWS account"):
            ensure_bucket(aws.s3, name, region="us-east-1", tags=TAGS)
    finally:
        other.delete_bucket(Bucket=name)


@pytest.mark.parametrize("name", ["Bad_Name", "ab", "a..b-bucket", "192.168.1.1", "-leading"])
def test_invalid_bucket_names_are_refused_before_any_call(aws, name):
    with pytest.raises(ValueError, match="invalid S3 bucket name"):
        ensure_bucket(aws.s3, name, region="us-east-1", tags=TAGS)


def test_unknown_region_is_refused(aws, bucket_name):
    with pytest.raises(ValueError, match="unknown AWS region"):
        ensure_bucket(aws.s3, bucket_name(), region="eu-nowhere-7", tags=TAGS)


# --- FSx: Stubber, because the moto server has no data repository tasks -----------------------


TASK_ID = "task-0123456789abcdef0"
FS_ID = "fs-0123456789abcdef0"


def task(lifecycle: str, **extra) -> dict:
    return {
        "TaskId": TASK_ID,
        "Lifecycle": lifecycle,
        "Type": "EXPORT_TO_REPOSITORY",
        "CreationTime": "2026-01-01T00:00:00Z",
        **extra,
    }


def test_fsx_task_start_is_idempotent_and_reports_failure_emulator_limited(local_stack):
    """Emulator-limited: moto answers 500 for FSx data repository tasks; botocore's Stubber checks the
    calls against the FSx service model and returns documented response shapes."""
    fsx = aws_client("fsx", aws_conn_id="aws_default")
    expected_create = {
        "Type": "EXPORT_TO_REPOSITORY",
        "FileSystemId": FS_ID,
        "Report": {"Enabled": False},
        "ClientRequestToken": ANY,
        "Tags": ANY,
        "Paths": ["results/"],
    }
    with Stubber(fsx) as stub:
        stub.add_response("describe_data_repository_tasks", {"DataRepositoryTasks": []})
        stub.add_response("create_data_repository_task", {"DataRepositoryTask": task("PENDING")}, expected_create)
        # The retry finds the task by its pcflow:task-key tag and creates nothing.
        key_tag = [{"Key": "pcflow:task-key", "Value": "run-1/export"}]
        stub.add_response("describe_data_repository_tasks", {"DataRepositoryTasks": [task("EXECUTING", Tags=key_tag)]})
        failed = task("FAILED", FailureDetails={"Message": "access denied to bucket"})
        stub.add_response("describe_data_repository_tasks", {"DataRepositoryTasks": [failed]})
        kwargs = {"file_system_id": FS_ID, "task_type": "export", "task_key": "run-1/export", "paths": ["results/"]}
        assert start_data_repository_task(fsx, **kwargs) == TASK_ID
        assert start_data_repository_task(fsx, **kwargs) == TASK_ID
        with pytest.raises(DataRepositoryTaskFailed, match="access denied to bucket"):
            data_repository_task_result(fsx, TASK_ID)
        stub.assert_no_pending_responses()
    with pytest.raises(ValueError, match="task_type must be one of"):
        start_data_repository_task(fsx, file_system_id=FS_ID, task_type="sync", task_key="k")


def test_fsx_trigger_serializes_with_retry_mode():
    trigger = FsxDataRepositoryTaskTrigger(
        task_id="task-0123456789abcdef9", botocore_config={"retries": {"mode": "standard"}}
    )
    path, kwargs = trigger.serialize()
    assert path == "pcflow.aws.waits.FsxDataRepositoryTaskTrigger"
    assert kwargs["task_id"] == "task-0123456789abcdef9" and kwargs["botocore_config"]["retries"]["mode"] == "standard"
    rebuilt = FsxDataRepositoryTaskTrigger(**kwargs)
    waiter = rebuilt.hook().get_waiter("DataRepositoryTaskComplete", client=aws_client("fsx", aws_conn_id=None))
    assert waiter.config.max_attempts == 240


def test_fsx_operator_refuses_unknown_task_type():
    with pytest.raises(ValueError, match="task_type must be one of"):
        FsxDataRepositoryTaskOperator(task_id="x", file_system_id=FS_ID, task_type="copy", task_name="n")
