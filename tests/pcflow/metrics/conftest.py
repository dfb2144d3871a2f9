"""Fixtures of the metrics tests: the Slurm hook, retrying AWS clients on the moto server, a bucket."""

from __future__ import annotations

import uuid

import pytest
from dagrun import delete_bucket

from pcflow.aws.clients import aws_client
from pcflow.slurm.hook import SlurmHook


@pytest.fixture
def slurm(local_stack) -> SlurmHook:
    hook = SlurmHook()
    yield hook
    hook.close()


@pytest.fixture(scope="session")
def s3(local_stack):
    return aws_client("s3", aws_conn_id="aws_default")


@pytest.fixture(scope="session")
def cloudwatch(local_stack):
    return aws_client("cloudwatch", aws_conn_id="aws_default")


@pytest.fixture
def bucket(s3) -> str:
    name = f"pcflow-metrics-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    yield name
    delete_bucket(s3, name)


@pytest.fixture
def stack_name() -> str:
    return f"t{uuid.uuid4().hex[:10]}"
