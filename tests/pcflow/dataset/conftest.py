"""Fixtures of the dataset tests: an S3 client on the local stack's moto server (HTTPS), a fresh
uniquely named bucket per test, and a counter of the write requests the loader sends."""

from __future__ import annotations

import collections
import uuid

import pytest
from dagrun import delete_bucket
from dataset_s3 import make_client

from pcflow.naming import standard_tags

WRITES = ("PutObject", "UploadPart", "CreateMultipartUpload", "CompleteMultipartUpload", "CopyObject")


class RequestCounter:
    """Counts API calls (by operation name, with their parameters) the code under test makes on `client`."""

    def __init__(self, client):
        self.calls: collections.Counter[str] = collections.Counter()
        self.keys: list[tuple[str, str]] = []
        client.meta.events.register("provide-client-params.s3.*", self._seen)

    def _seen(self, model, params, **_):
        self.calls[model.name] += 1
        if model.name in ("PutObject", "CreateMultipartUpload"):
            self.keys.append((model.name, params.get("Key", "")))

    def reset(self):
        self.calls.clear()
        self.keys.clear()

    def data_puts(self) -> list[str]:
        """Keys of dataset objects uploaded (not the manifest, not the journal)."""
        return [k for _, k in self.keys if not k.endswith("manifest.json") and "/_pcflow/" not in k]


@pytest.fixture
def s3(local_stack):
    return make_client()


@pytest.fixture
def stack_name():
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def tags(stack_name):
    return standard_tags(stack=stack_name, component="dataset", run="test-run")


@pytest.fixture
def bucket(s3):
    name = f"pcflow-dataset-test-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    yield name
    delete_bucket(s3, name)


@pytest.fixture
def counter(s3):
    return RequestCounter(s3)
