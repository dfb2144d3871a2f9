"""The dataset bucket stacks share, on the moto server: one stack's use never re-tags it, one stack's
removal never deletes it while another uses it, and a bucket pcflow did not create is adopted with
every setting its owner chose, or refused (without a write) when it lacks what pcflow needs."""

from __future__ import annotations

import uuid

import pytest
from dagrun import delete_bucket, remove_stack

from pcflow.aws.buckets import USERS_PREFIX, BucketSettingsDiffer, bucket_users
from pcflow.aws.clients import aws_client
from pcflow.aws.storage import ABORT_INCOMPLETE_UPLOADS, EXPIRE_REPLACED_VERSIONS, ensure_shared_bucket

pytestmark = [pytest.mark.security, pytest.mark.stack]
RULES = [ABORT_INCOMPLETE_UPLOADS, EXPIRE_REPLACED_VERSIONS]


@pytest.fixture
def s3(local_stack):
    return aws_client("s3")


@pytest.fixture
def bucket(s3):
    name = f"pcflow-shared-{uuid.uuid4().hex[:10]}"
    yield name
    if name in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
        delete_bucket(s3, name)


def use(s3, name: str, stack: str) -> dict:
    """What a run's `ensure_dataset_bucket` task does for its stack."""
    return ensure_shared_bucket(s3, name, region="us-east-1", stack=stack, versioning=True, lifecycle_rules=RULES)


def settings(s3, name: str) -> dict:
    """Every bucket setting pcflow could touch, as S3 reports it."""
    read = {
        "tags": lambda: s3.get_bucket_tagging(Bucket=name)["TagSet"],
        "versioning": lambda: s3.get_bucket_versioning(Bucket=name).get("Status"),
        "encryption": lambda: s3.get_bucket_encryption(Bucket=name)["ServerSideEncryptionConfiguration"],
        "public_access": lambda: s3.get_public_access_block(Bucket=name)["PublicAccessBlockConfiguration"],
        "ownership": lambda: s3.get_bucket_ownership_controls(Bucket=name)["OwnershipControls"],
        "lifecycle": lambda: s3.get_bucket_lifecycle_configuration(Bucket=name)["Rules"],
    }
    found = {}
    for setting, call in read.items():
        try:
            found[setting] = call()
        except s3.exceptions.ClientError as error:
            found[setting] = error.response["Error"]["Code"]
    return found


def test_removing_one_stack_keeps_the_bucket_another_stack_uses(s3, bucket):
    first, second = f"a{uuid.uuid4().hex[:8]}", f"b{uuid.uuid4().hex[:8]}"
    assert use(s3, bucket, first)["created"] is True
    s3.put_object(Bucket=bucket, Key="datasets/digits/part-0.tar", Body=b"data")
    tags = settings(s3, bucket)["tags"]
    assert {"Key": "pcflow:created-by", "Value": first} in tags and "pcflow:stack" not in str(tags)
    assert use(s3, bucket, second)["users"] == sorted([first, second])
    assert settings(s3, bucket)["tags"] == tags  # the second stack's run did not re-tag it

    assert remove_stack(first) == []
    assert bucket_users(s3, bucket) == [second]
    assert s3.get_object(Bucket=bucket, Key="datasets/digits/part-0.tar")["Body"].read() == b"data"
    assert remove_stack(second) == []  # its last user: the bucket pcflow created goes with it
    assert bucket not in [b["Name"] for b in s3.list_buckets()["Buckets"]]


def test_an_admins_bucket_is_adopted_with_its_settings_and_never_deleted(s3, bucket):
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    s3.put_public_access_block(
        Bucket=bucket,
        PublicAccessBlockConfiguration=dict.fromkeys(
            ("BlockPublicAcls", "IgnorePublicAcls", "BlockPublicPolicy", "RestrictPublicBuckets"), True
        ),
    )
    kms = {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": "alias/team-data"}
    s3.put_bucket_encryption(
        Bucket=bucket, ServerSideEncryptionConfiguration={"Rules": [{"ApplyServerSideEncryptionByDefault": kms}]}
    )
    s3.put_bucket_ownership_controls(Bucket=bucket, OwnershipControls={"Rules": [{"ObjectOwnership": "ObjectWriter"}]})
    rule = {"ID": "team-archive", "Status": "Enabled", "Filter": {"Prefix": "old/"}, "Expiration": {"Days": 30}}
    s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": [rule]})
    s3.put_bucket_tagging(Bucket=bucket, Tagging={"TagSet": [{"Key": "team", "Value": "vision"}]})
    before = settings(s3, bucket)
    stack = f"a{uuid.uuid4().hex[:8]}"

    adopted = use(s3, bucket, stack)
    assert adopted["created"] is False and settings(s3, bucket) == before
    assert [d.split(":")[0] for d in adopted["differences"]] == ["object ownership", "lifecycle rules"]
    assert remove_stack(stack) == []
    assert settings(s3, bucket) == before and bucket_users(s3, bucket) == []  # not pcflow's to delete


@pytest.mark.parametrize("missing", ["versioning", "Block Public Access"])
def test_a_bucket_without_what_pcflow_needs_is_refused_untouched(s3, bucket, missing):
    s3.create_bucket(Bucket=bucket)
    if missing != "versioning":
        s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    else:
        s3.put_public_access_block(
            Bucket=bucket,
            PublicAccessBlockConfiguration=dict.fromkeys(
                ("BlockPublicAcls", "IgnorePublicAcls", "BlockPublicPolicy", "RestrictPublicBuckets"), True
            ),
        )
    before = settings(s3, bucket)
    with pytest.raises(BucketSettingsDiffer, match=f"does not change .* it needs: {missing}.*aws s3api put-"):
        use(s3, bucket, f"a{uuid.uuid4().hex[:8]}")
    assert settings(s3, bucket) == before
    assert s3.list_objects_v2(Bucket=bucket, Prefix=USERS_PREFIX).get("KeyCount") == 0
