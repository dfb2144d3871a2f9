"""Thin, provider-agnostic operators over `providers.py`: validate (first task), ensure, delete (teardown).

`provider` is the profile's choice ("static" | "parallelcluster"); `cluster` is the spec's cluster
section (`ClusterSpec` fields for ParallelCluster). All return plain JSON dicts.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any, ClassVar

from airflow.sdk import BaseOperator

# The providers (the SSH hook, the pcluster CLI's hook, the pydantic specs) are imported by the methods
# that use them: a DAG file declaring these operators must parse without them.


class _ClusterOperator(BaseOperator):
    template_fields: Sequence[str] = ("provider", "cluster", "stack", "ssh_conn_id", "suppress_validators", "ttl_hours")
    template_fields_renderers: ClassVar[dict[str, str]] = {"cluster": "json"}

    def __init__(
        self,
        *,
        provider: str,
        cluster: Mapping[str, Any] | None = None,
        stack: str,
        aws_conn_id: str | None = "aws_default",
        region_name: str | None = None,
        ssh_conn_id: str | None = None,
        pcluster_path: str | None = None,
        suppress_validators: Sequence[str] = (),
        run_scoped: bool = False,
        ttl_hours: float | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.provider = provider
        self.cluster = cluster
        self.stack = stack
        self.aws_conn_id = aws_conn_id
        self.region_name = region_name
        self.ssh_conn_id = ssh_conn_id
        self.pcluster_path = pcluster_path
        self.suppress_validators = suppress_validators
        self.run_scoped = run_scoped
        self.ttl_hours = ttl_hours

    @cached_property
    def cluster_provider(self) -> Any:
        from pcflow.cluster.providers import PROVIDERS, make_provider

        if self.provider not in PROVIDERS:
            raise ValueError(f"unknown cluster provider {self.provider!r}: choose one of {', '.join(PROVIDERS)}")
        return make_provider(
            self.provider,
            cluster=self.cluster if self.provider == "static" else None,
            aws_conn_id=self.aws_conn_id,
            region_name=self.region_name,
            ssh_conn_id=self.ssh_conn_id,
            pcluster_path=self.pcluster_path,
            suppress_validators=tuple(self.suppress_validators or ()),
        )

    def _run_and_ttl(self, context: Any) -> tuple[str | None, dt.timedelta | None]:
        from pcflow.naming import run_key_from_context

        run = run_key_from_context(context) if self.run_scoped else None
        ttl = dt.timedelta(hours=self.ttl_hours) if self.ttl_hours is not None else None
        return run, ttl

    @property
    def trigger_aws_kwargs(self) -> dict[str, Any]:
        from pcflow.aws.clients import retry_botocore_config

        return {
            "aws_conn_id": self.aws_conn_id,
            "region_name": self.cluster_provider.hook.region_name,
            "botocore_config": retry_botocore_config(None),
        }


class ValidateClusterConfigOperator(_ClusterOperator):
    """The pipeline's first task: ParallelCluster's dry run (or the static cluster's health check).

    :param config_bucket: when set, the rendered config is also kept in S3 under
        `<config_prefix>/<run key>/cluster-config.yaml` (it is always in the returned XCom).
    """

    template_fields: Sequence[str] = (*_ClusterOperator.template_fields, "config_bucket", "config_prefix")
    ui_color = "#e8f7e4"

    def __init__(self, *, config_bucket: str | None = None, config_prefix: str = "pcflow/runs", **kwargs: Any):
        super().__init__(**kwargs)
        self.config_bucket = config_bucket
        self.config_prefix = config_prefix

    def execute(self, context: Any) -> dict[str, Any]:
        from pcflow.cluster.providers import validate_cluster
        from pcflow.naming import run_key_from_context

        run, ttl = self._run_and_ttl(context)
        result = validate_cluster(self.cluster_provider, self.cluster, stack=self.stack, run=run, ttl=ttl)
        if self.config_bucket and "config" in result:
            key = f"{self.config_prefix.strip('/')}/{run_key_from_context(context)}/cluster-config.yaml"
            self.cluster_provider.clients("s3").put_object(
                Bucket=self.config_bucket, Key=key, Body=result["config"].encode(), ContentType="application/yaml"
            )
            result["config_s3_uri"] = f"s3://{self.config_bucket}/{key}"
            self.log.info("rendered cluster config kept at %s", result["config_s3_uri"])
        return result


class EnsureClusterOperator(_ClusterOperator):
    """Adopt, refuse, update or create the cluster; deferrable wait on its CloudFormation stack."""

    ui_color = "#c6e2ff"

    def __init__(self, *, deferrable: bool = True, waiter_delay: int = 30, waiter_max_attempts: int = 240, **kwargs):
        super().__init__(**kwargs)
        self.deferrable = deferrable
        self.waiter_delay = waiter_delay
        self.waiter_max_attempts = waiter_max_attempts

    def execute(self, context: Any) -> dict[str, Any]:
        from pcflow.cluster.providers import ensure_cluster
        from pcflow.cluster.spec import ClusterSpec
        from pcflow.cluster.static import StaticProvider

        run, ttl = self._run_and_ttl(context)
        provider = self.cluster_provider
        if isinstance(provider, StaticProvider) or not self.deferrable:
            return ensure_cluster(
                provider, self.cluster, stack=self.stack, run=run, ttl=ttl,
                waiter_delay=self.waiter_delay, waiter_max_attempts=self.waiter_max_attempts,
            )  # fmt: skip
        spec = ClusterSpec.parse(self.cluster)
        step = provider.start(spec, provider.render(spec, stack=self.stack, run=run, ttl=ttl))
        self.log.info("cluster %s: %s", step.cluster_name, step.action)
        if step.waiter is None:
            return provider.finish(spec, step.action).to_xcom()
        from pcflow.cluster.triggers import ClusterStackTrigger

        self.defer(
            trigger=ClusterStackTrigger(
                stack_name=step.stack_name, waiter_name=step.waiter, waiter_delay=self.waiter_delay,
                waiter_max_attempts=self.waiter_max_attempts, **self.trigger_aws_kwargs,
            ),
            method_name="execute_complete",
            kwargs={"action": step.action},
        )  # fmt: skip

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None, action: str = "created") -> Any:
        from pcflow.cluster.spec import ClusterSpec

        event = event or {}
        if event.get("status") not in (None, "success"):
            self.log.warning("stack wait ended with %s: %s", event.get("status"), event.get("message"))
        # The outcome is read from describe-cluster either way; a failure is diagnosed there.
        return self.cluster_provider.finish(ClusterSpec.parse(self.cluster), action).to_xcom()


class DeleteClusterOperator(_ClusterOperator):
    """Idempotent delete (a static cluster is left alone); usable as an Airflow teardown task.

    :param cluster_name: the cluster to delete (default: the `name` in `cluster`), templated so it can
        come from the ensure task's XCom.
    :param export_fsx: export the cluster's FSx file systems to their S3 repository first.
    """

    template_fields: Sequence[str] = (*_ClusterOperator.template_fields, "cluster_name", "export_fsx")
    ui_color = "#f4a6a6"

    def __init__(
        self,
        *,
        cluster_name: str | None = None,
        export_fsx: bool = False,
        deferrable: bool = True,
        waiter_delay: int = 30,
        waiter_max_attempts: int = 240,
        **kwargs: Any,
    ):
        kwargs.setdefault("stack", "unused")
        super().__init__(**kwargs)
        self.cluster_name = cluster_name
        self.export_fsx = export_fsx
        self.deferrable = deferrable
        self.waiter_delay = waiter_delay
        self.waiter_max_attempts = waiter_max_attempts

    def _name(self) -> str | None:
        return self.cluster_name or (self.cluster or {}).get("name")

    def execute(self, context: Any) -> dict[str, Any]:
        from pcflow.cluster.providers import delete_cluster
        from pcflow.cluster.static import StaticProvider

        provider = self.cluster_provider
        if isinstance(provider, StaticProvider) or not self.deferrable:
            return delete_cluster(
                provider, self._name(), export_fsx=bool(self.export_fsx),
                waiter_delay=self.waiter_delay, waiter_max_attempts=self.waiter_max_attempts,
            )  # fmt: skip
        from pcflow.naming import run_key_from_context

        name = self._name()
        if not name:
            raise ValueError("DeleteClusterOperator needs cluster_name (or a cluster section with a name)")
        result = provider.start_delete(
            name, export_fsx=bool(self.export_fsx), task_key=f"{run_key_from_context(context)}/export-before-delete"
        )
        if not result.pop("wait"):
            return result
        from pcflow.cluster.triggers import ClusterStackTrigger

        self.defer(
            trigger=ClusterStackTrigger(
                stack_name=name, waiter_name="stack_delete_complete", waiter_delay=self.waiter_delay,
                waiter_max_attempts=self.waiter_max_attempts, **self.trigger_aws_kwargs,
            ),
            method_name="execute_complete",
            kwargs={"result": result},
        )  # fmt: skip

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None, result: dict | None = None) -> Any:
        event = event or {}
        if event.get("status") not in (None, "success"):
            raise RuntimeError(
                f"cluster {self._name()} was not deleted: {event.get('message')}. Look at the stack's events in "
                "CloudFormation (DELETE_FAILED resources), fix or delete them by hand, and run this task again"
            )
        return result or {"cluster_name": self._name(), "deleted": True}
