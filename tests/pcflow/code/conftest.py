"""The code tests' shared fixture: moto in this process, for unit tests of S3 calls that need no stack."""

from __future__ import annotations

import boto3
import pytest
from moto import mock_aws


@pytest.fixture
def s3(monkeypatch):
    """An S3 client of moto's in-process mock. The local stack's endpoint is taken out of the environment
    first: with it set, the client would reach the stack's moto server (and leave buckets there)."""
    for variable in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_CA_BUNDLE"):
        monkeypatch.delenv(variable, raising=False)
    with mock_aws():
        yield boto3.client("s3", region_name="us-east-1")
