"""A bundle into the stack's bucket once (pcflow.code.upload): HEAD before PUT, a re-run sends 0 bytes,
and an object at the key that is not these bytes is replaced, not trusted."""

from __future__ import annotations

import pytest

from pcflow.bundles import pack
from pcflow.checksums import ChecksumMismatch
from pcflow.code.upload import bundle_from_bucket, bundle_key, commit_key, record_commit, recorded_commit, upload_once


@pytest.fixture
def bundle(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    return pack(tmp_path, name="p", max_bytes=1 << 20)


def test_the_bundle_goes_up_once_by_its_id_with_its_checksum_and_tags(bundle, s3):
    s3.create_bucket(Bucket="pcflow-data")
    first = upload_once(s3, "pcflow-data", bundle, stack="dev")
    assert first == {"key": f"pcflow/code/{bundle.digest}.tar", "uploaded_bytes": len(bundle.data)}
    assert upload_once(s3, "pcflow-data", bundle, stack="dev")["uploaded_bytes"] == 0
    assert s3.get_object(Bucket="pcflow-data", Key=first["key"])["Body"].read() == bundle.data
    tags = {t["Key"]: t["Value"] for t in s3.get_object_tagging(Bucket="pcflow-data", Key=first["key"])["TagSet"]}
    assert tags["pcflow:stack"] == "dev"


def test_an_object_at_the_key_that_is_not_the_bundle_is_replaced(bundle, s3):
    s3.create_bucket(Bucket="pcflow-data")
    s3.put_object(Bucket="pcflow-data", Key=bundle_key(bundle.digest), Body=b"someone else's bytes")
    assert upload_once(s3, "pcflow-data", bundle, stack="dev")["uploaded_bytes"] == len(bundle.data)
    assert s3.get_object(Bucket="pcflow-data", Key=bundle_key(bundle.digest))["Body"].read() == bundle.data


def test_a_commits_record_gives_back_its_bundle_and_a_changed_bundle_is_refused(bundle, s3):
    s3.create_bucket(Bucket="pcflow-data")
    limits = {"max_mib": 1, "allow_secrets": False}
    key = commit_key("file:///r.git", "c" * 40, None, limits)
    assert (
        key
        != commit_key("file:///r.git", "c" * 40, "sub", limits)
        != commit_key("file:///r.git", "c" * 40, None, {**limits, "max_mib": 2})
    )
    assert recorded_commit(s3, "pcflow-data", key) is None
    upload_once(s3, "pcflow-data", bundle, stack="dev")
    record_commit(s3, "pcflow-data", key, bundle, stack="dev")
    record = recorded_commit(s3, "pcflow-data", key)
    assert bundle_from_bucket(s3, "pcflow-data", record) == bundle
    s3.put_object(Bucket="pcflow-data", Key=bundle_key(bundle.digest), Body=b"x" * len(bundle.data))
    with pytest.raises(ChecksumMismatch, match="is not the bundle recorded for it"):
        bundle_from_bucket(s3, "pcflow-data", record)
    s3.put_object(Bucket="pcflow-data", Key=key, Body=b'{"digest": "../../etc"}')  # not a record pcflow wrote
    assert recorded_commit(s3, "pcflow-data", key) is None
