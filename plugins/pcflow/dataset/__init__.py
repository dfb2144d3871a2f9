"""The dataset stage: load a training dataset into S3 (sync or tar shards), manifest last, FSx import.

Plain functions for DAGs and other stages; `operators.DatasetLoadOperator` is the thin Airflow shell.
Imports are kept light here (no boto3 at package import) so DAG parsing stays fast.
"""

from __future__ import annotations

__all__ = [
    "DatasetLoadOperator",
    "materialize_digits",
    "read_manifest",
    "read_shard",
    "resolve_partition",
    "shard_to_s3",
    "sync_to_s3",
]


def __getattr__(name: str):
    import importlib

    modules = {
        "DatasetLoadOperator": "operators",
        "materialize_digits": "digits",
        "read_manifest": "manifest",
        "read_shard": "shard",
        "resolve_partition": "partition",
        "shard_to_s3": "shard",
        "sync_to_s3": "sync",
    }
    if name not in modules:
        raise AttributeError(name)
    return getattr(importlib.import_module(f"pcflow.dataset.{modules[name]}"), name)
