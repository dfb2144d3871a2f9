"""The dataset tests' S3 client on the local stack's moto server (HTTPS): retrying, with a pool as wide as
the loader's. A module of its own (not conftest.py) so that test modules can import it."""

from __future__ import annotations

import boto3
from botocore.config import Config


def make_client(region: str = "us-east-1"):
    return boto3.client(
        "s3",
        region_name=region,
        config=Config(retries={"mode": "standard", "max_attempts": 5}, max_pool_connections=32),
    )
