"""DatasetLoadOperator: the dataset stage of a DAG, a thin shell over sync_to_s3 / shard_to_s3.

Loads a source into `s3://<bucket>/<prefix>/<partition>/` (partition = the run's logical date when
scheduled, explicit when triggered by hand), publishes manifest.json last, and, when the cluster's FSx
for Lustre file system is already linked to that bucket, imports the new prefix and waits for the
import in the triggerer.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator, Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import Context, conf

from pcflow.aws.base import PcflowAwsOperator, aws_template_fields
from pcflow.dataset.partition import resolve_partition, validate_prefix
from pcflow.dataset.posix import FsxOwner
from pcflow.errors import ServiceFailed
from pcflow.events import validate_event
from pcflow.naming import Component, run_key_from_context, standard_tags, validate_stack_name

if TYPE_CHECKING:
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

MODES = ("sync", "shard")
#: Large parts move through s3transfer's own pool (10 connections) next to the per-file workers.
TRANSFER_CONNECTIONS = 10


class DatasetLoadOperator(PcflowAwsOperator):
    """Load a training dataset into S3, incrementally and atomically; optionally import it into FSx.

    :param source: local directory on the worker, or `s3://bucket/prefix` (templated).
    :param bucket: destination bucket; must exist, in the task's region (`region_name`, else the
        connection's) (templated).
    :param prefix: key prefix of the dataset, e.g. `datasets/imagenet` (templated).
    :param partition: explicit partition; required for manual runs, else the logical date (templated).
    :param mode: `sync` (mirror file for file) or `shard` (WebDataset tar shards) (templated).
    :param stack: pcflow stack name, for the `pcflow:*` tags on every object written.
    :param fsx_file_system_id: the cluster's FSx for Lustre file system, when it already exists (templated).
    :param deferrable: wait for the FSx import in the triggerer (default) rather than in the worker.

    Returns (XCom) the load summary: manifest_uri, uri, bucket, root, partition, mode, content_hash,
    object_count, bytes, samples, uploaded, skipped, manifest_written, committed_by, fsx_import_task_id.
    Outlets get an event when the run committed new content (`pcflow.lineage`): an AssetAlias, one of
    the stack's own dataset Asset, with the partition, its location and content hash as extra.
    """

    template_fields: Sequence[str] = aws_template_fields(
        "source", "bucket", "prefix", "partition", "mode", "fsx_file_system_id", "fsx_owner", "stack"
    )
    ui_color = "#c9e4f5"

    def __init__(
        self,
        *,
        source: str,
        bucket: str,
        prefix: str,
        stack: str,
        partition: str | None = None,
        mode: str = "sync",
        workers: int = 16,
        target_shard_bytes: int = 128 * 2**20,
        shuffle_seed: int | None = 0,
        prune: bool | None = None,
        ttl: dt.timedelta | None = None,
        fsx_file_system_id: str | None = None,
        fsx_owner: Mapping[str, int] | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        waiter_delay: int = 30,
        waiter_max_attempts: int = 240,
        progress_interval_s: float = 15.0,
        botocore_config: dict | None = None,
        **kwargs: Any,
    ) -> None:
        config = {
            "retries": {"mode": "standard", "max_attempts": 10},
            "max_pool_connections": workers + TRANSFER_CONNECTIONS,
            **(botocore_config or {}),
        }
        super().__init__(botocore_config=config, **kwargs)
        self.source, self.bucket, self.prefix, self.partition, self.mode = source, bucket, prefix, partition, mode
        self.stack = stack
        self.workers, self.target_shard_bytes, self.shuffle_seed = workers, target_shard_bytes, shuffle_seed
        self.prune, self.ttl = prune, ttl
        self.fsx_file_system_id = fsx_file_system_id
        self.fsx_owner = fsx_owner  # {uid, gid}: whom FSx makes the loaded files' owner (pcflow.dataset.posix)
        self.deferrable, self.waiter_delay, self.waiter_max_attempts = deferrable, waiter_delay, waiter_max_attempts
        self.progress_interval_s = progress_interval_s

    @cached_property
    def hook(self) -> S3Hook:
        from airflow.providers.amazon.aws.hooks.s3 import S3Hook

        return S3Hook(**self._hook_parameters)

    def _check_arguments(self) -> None:
        """Bad input fails here, after templating and before any request."""
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if not self.bucket or not isinstance(self.bucket, str):
            raise ValueError("bucket is required: the S3 bucket the dataset is loaded into")
        if not self.source or not isinstance(self.source, str):
            raise ValueError("source is required: a local directory on the worker or an s3:// prefix")
        validate_prefix(self.prefix)
        validate_stack_name(self.stack)

    def execute(self, context: Context) -> dict[str, Any]:
        from pcflow.dataset.shard import shard_to_s3
        from pcflow.dataset.sync import sync_to_s3

        self._check_arguments()
        partition = resolve_partition(context, self.partition)
        linked = self._fsx_links()  # a wrong file system id fails here, before anything is uploaded
        run = run_key_from_context(context)
        tags = standard_tags(stack=self.stack, component=Component.DATASET, run=run, ttl=self.ttl)
        common = {
            "bucket": self.bucket,
            "prefix": self.prefix,
            "partition": partition,
            "tags": tags,
            "run": run,
            "workers": self.workers,
            "progress_interval_s": self.progress_interval_s,
            "logger": self.log,
            "fsx_owner": FsxOwner(self.fsx_owner["uid"], self.fsx_owner["gid"]) if self.fsx_owner else None,
        }
        self.log.info(
            "loading %s into s3://%s/%s (partition %s, mode %s)",
            self.source,
            self.bucket,
            self.prefix,
            partition,
            self.mode,
        )
        if self.mode == "shard":
            result = shard_to_s3(
                self.hook.conn,
                self.source,
                target_shard_bytes=self.target_shard_bytes,
                shuffle_seed=self.shuffle_seed,
                prune=True if self.prune is None else self.prune,
                **common,
            )
        else:
            result = sync_to_s3(self.hook.conn, self.source, prune=bool(self.prune), **common)
        result["fsx_import_task_id"] = None
        if self.fsx_file_system_id:
            result = self._import_into_fsx(result, tags, linked)
        return self._announce(context, result)

    def _announce(self, context: Context, result: dict[str, Any]) -> dict[str, Any]:
        """An event on each outlet (an AssetAlias: the stack's own dataset Asset) when this run committed
        new content to the partition; a load that found the same bytes there announces nothing."""
        from pcflow.lineage import dataset_extra, emit, is_new_content

        if is_new_content(result, run_key_from_context(context)):
            emit(context, self.outlets or [], self.stack, dataset_extra(result))
        elif self.outlets:
            self.log.info(
                "partition %s holds the content run %s committed: no asset event (nothing new)",
                result["partition"],
                result.get("committed_by"),
            )
        return result

    def _fsx_links(self) -> list[str]:
        """S3 paths the cluster's file system is linked to ([] when the operator has no file system)."""
        if not self.fsx_file_system_id:
            return []
        from pcflow.dataset.fsx import linked_repository_paths

        return linked_repository_paths(self.client("fsx"), self.fsx_file_system_id)

    def _import_into_fsx(self, result: dict[str, Any], tags: dict[str, str], linked: list[str]) -> dict[str, Any]:
        from pcflow.aws.storage import await_data_repository_task
        from pcflow.dataset.fsx import covers, start_import

        if not any(covers(path, result["uri"]) for path in linked):
            self.log.info(
                "FSx %s is not linked to %s (linked: %s): the link made at cluster creation imports it",
                self.fsx_file_system_id,
                result["uri"],
                ", ".join(linked) or "nothing",
            )
            return result
        task_id = start_import(
            self.client("fsx"),
            file_system_id=self.fsx_file_system_id,
            s3_uri=result["uri"],
            content_hash=result["content_hash"],
            tags=tags,
        )
        result["fsx_import_task_id"] = task_id
        self.log.info("FSx import task %s started for %s", task_id, result["uri"])
        with self._import_failure_explained(result):  # a deferral passes through: it is no failure
            await_data_repository_task(
                self,
                task_id,
                deferrable=self.deferrable,
                delay=self.waiter_delay,
                max_attempts=self.waiter_max_attempts,
                resume_kwargs={"result": result},
            )
        return result

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None, result: Any = None) -> Any:
        """Back from the triggerer: FSx itself says whether the import succeeded (and why not)."""
        from pcflow.aws.storage import data_repository_task_result

        task_id = validate_event(event, task=self.task_id, required=("task_id",))["task_id"]
        with self._import_failure_explained(result):
            data_repository_task_result(self.client("fsx"), task_id)
        self.log.info("FSx import task %s succeeded", task_id)
        return self._announce(context, result)

    @contextlib.contextmanager
    def _import_failure_explained(self, result: dict[str, Any]) -> Iterator[None]:
        from pcflow.aws.storage import DataRepositoryTaskFailed

        try:
            yield
        except DataRepositoryTaskFailed as err:
            raise ServiceFailed(
                f"FSx import of {result['uri']} failed: {err}. The data is in S3 and its manifest is committed; "
                "fix the cause (for example the file system's S3 permissions) and clear this task to retry"
            ) from err
