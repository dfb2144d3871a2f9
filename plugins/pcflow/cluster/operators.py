"""Thin, provider-agnostic operators over `providers.py`: validate (first task), ensure, delete (teardown).

`provider` is the profile's choice ("static" | "parallelcluster"); `cluster` is the spec's cluster
section (`ClusterSpec` fields for ParallelCluster). All return plain JSON dicts.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import conf

from pcflow.aws.base import PcflowAwsOperator, aws_template_fields
from pcflow.errors import ConfigurationError, WaitFailed, profile_setting, refused
from pcflow.events import SUCCESS, require_success, validate_event

if TYPE_CHECKING:
    from pcflow.cluster.info import ClusterInfo

# The providers (the SSH hook, the pcluster CLI's hook, the pydantic specs) are imported by the methods
# that use them: a DAG file declaring these operators must parse without them.

CONFIG_FILE = "cluster-config.yaml"


class _ClusterOperator(PcflowAwsOperator):
    """The cluster operators' settings: the provider and its cluster section, the stack (and run) that owns
    the cluster, where its rendered config is kept; the AWS connection of `PcflowAwsOperator` reaches the
    pcluster CLI and every client the provider makes."""

    template_fields: Sequence[str] = aws_template_fields(
        "provider", "cluster", "stack", "ssh_conn_id", "suppress_validators", "ttl_hours", "config_bucket"
    )
    template_fields_renderers: ClassVar[dict[str, str]] = {"cluster": "json"}

    def __init__(
        self,
        *,
        provider: str,
        cluster: Mapping[str, Any] | None = None,
        stack: str,
        ssh_conn_id: str | None = None,
        pcluster_path: str | None = None,
        suppress_validators: Sequence[str] = (),
        run_scoped: bool = False,
        ttl_hours: float | None = None,
        config_bucket: str | None = None,
        config_prefix: str = "runs",
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.provider = provider
        self.cluster = cluster
        self.stack = stack
        self.ssh_conn_id = ssh_conn_id
        self.pcluster_path = pcluster_path
        self.suppress_validators = suppress_validators
        self.run_scoped = run_scoped
        self.ttl_hours = ttl_hours
        self.config_bucket = config_bucket
        self.config_prefix = config_prefix

    @cached_property
    def cluster_provider(self) -> Any:
        from pcflow.cluster.providers import PROVIDERS, make_provider

        if self.provider not in PROVIDERS:
            raise ConfigurationError(
                f"unknown cluster provider {self.provider!r}: choose one of {', '.join(PROVIDERS)}"
            )
        return make_provider(
            self.provider,
            cluster=self.cluster if self.provider == "static" else None,
            **self.aws_connection,
            ssh_conn_id=self.ssh_conn_id,
            pcluster_path=self.pcluster_path,
            suppress_validators=tuple(self.suppress_validators or ()),
        )

    def _tagging(self, context: Any) -> dict[str, Any]:
        """What the cluster's tags say of its run: its key (a run-scoped cluster), its TTL, and the DAG
        run making or adopting it (the janitor keeps the cluster while that run is unfinished)."""
        from pcflow.naming import dag_run_of, run_key_from_context

        run = run_key_from_context(context) if self.run_scoped else None
        ttl = dt.timedelta(hours=self.ttl_hours) if self.ttl_hours is not None else None
        return {"run": run, "ttl": ttl, "dag_run": dag_run_of(context)}

    def config_uri(self, context: Any, filename: str) -> str | None:
        """Where the rendered config of this run is kept: `s3://<config_bucket>/runs/<run key>/<filename>`."""
        from pcflow.naming import run_key_from_context

        if not self.config_bucket:
            return None
        return f"s3://{self.config_bucket}/{self.config_prefix.strip('/')}/{run_key_from_context(context)}/{filename}"

    def keep_config(self, context: Any, text: str, filename: str) -> str | None:
        """The rendered config kept with the run (reproducibility); returns its S3 URI."""
        uri = self.config_uri(context, filename)
        if uri:
            bucket, key = uri.removeprefix("s3://").split("/", 1)
            self.cluster_provider.clients("s3").put_object(
                Bucket=bucket, Key=key, Body=text.encode(), ContentType="application/yaml"
            )
            self.log.info("rendered cluster config kept at %s", uri)
        return uri


class ValidateClusterConfigOperator(_ClusterOperator):
    """Validate before spend: ParallelCluster's dry run (or the static cluster's health check).

    With `config_bucket`, the dry run's config is also kept in S3 as `cluster-config.dryrun.yaml`
    beside the run's other files (it is always in the returned XCom). A cluster that already exists
    is reported under `existing` (status, config hash, FSx file systems) for the stages after it.
    """

    ui_color = "#e8f7e4"

    def execute(self, context: Any) -> dict[str, Any]:
        from pcflow.cluster.pcluster import PclusterError
        from pcflow.cluster.providers import validate_cluster
        from pcflow.cluster.spec import ClusterSpecError

        tagging = self._tagging(context)
        try:  # ClusterSpecError and ClusterMismatch are pcflow's input errors: not retried
            result = validate_cluster(self.cluster_provider, self.cluster, stack=self.stack, **tagging)
        except PclusterError as error:
            if not error.config_rejected:
                raise  # throttling, a network error...: worth a retry
            raise refused("cluster.config", str(error), profile_setting(), ClusterSpecError) from None
        if "config" in result:
            result["config_s3_uri"] = self.keep_config(context, result["config"], "cluster-config.dryrun.yaml")
        return result


class _WaitingClusterOperator(_ClusterOperator):
    """A cluster operator that waits on the cluster's CloudFormation stack: in the triggerer when
    `deferrable` (default: Airflow's `operators.default_deferrable`, which pcflow's deployments set), else
    in the worker; every `waiter_delay` seconds, at most `waiter_max_attempts` times."""

    def __init__(
        self,
        *,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        waiter_delay: int = 30,
        waiter_max_attempts: int = 240,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.deferrable = deferrable
        self.waiter_delay = waiter_delay
        self.waiter_max_attempts = waiter_max_attempts

    @property
    def waits(self) -> dict[str, int]:
        return {"waiter_delay": self.waiter_delay, "waiter_max_attempts": self.waiter_max_attempts}


class EnsureClusterOperator(_WaitingClusterOperator):
    """Adopt, refuse, update or create the cluster; deferrable wait on its CloudFormation stack."""

    ui_color = "#c6e2ff"

    def execute(self, context: Any) -> dict[str, Any]:
        from pcflow.cluster.providers import ensure_cluster
        from pcflow.cluster.spec import ClusterSpec
        from pcflow.cluster.static import StaticProvider

        tagging = self._tagging(context)
        provider = self.cluster_provider
        if isinstance(provider, StaticProvider):
            return provider.ensure().to_xcom()
        spec = ClusterSpec.parse(self.cluster)
        rendered = provider.render(spec, stack=self.stack, **tagging)
        self.keep_config(context, rendered.text, CONFIG_FILE)
        if not self.deferrable:
            info = ensure_cluster(provider, spec, stack=self.stack, **tagging, **self.waits)
            return {**info, "config_s3_uri": self.config_uri(context, CONFIG_FILE)}
        step = provider.start(spec, rendered)  # ClusterNotOwned: an input error, not retried
        self.log.info("cluster %s: %s", step.cluster_name, step.action)
        if step.waiter is None:
            return self.outcome(context, provider.finish(spec, step.action))
        from pcflow.cluster.triggers import ClusterStackTrigger

        trigger = ClusterStackTrigger(
            stack_name=step.stack_name, waiter_name=step.waiter, **self.waits, **self.trigger_aws_kwargs
        )
        self.defer(trigger=trigger, method_name="execute_complete", kwargs={"action": step.action})

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None, action: str = "created") -> Any:
        """Back from the stack wait: the outcome is read from describe-cluster whatever the wait said, so a
        failed cluster is diagnosed there (its failure codes, stack events, bootstrap log), not by the
        trigger."""
        from pcflow.cluster.spec import ClusterSpec

        event = validate_event(event, task=self.task_id)
        if event["status"] != SUCCESS:
            self.log.warning("stack wait ended with %s: %s", event["status"], event.get("message"))
        # The outcome is read from describe-cluster either way; a failure is diagnosed there.
        return self.outcome(context, self.cluster_provider.finish(ClusterSpec.parse(self.cluster), action))

    def outcome(self, context: Any, info: ClusterInfo) -> dict[str, Any]:
        """The task's XCom: the cluster's info and where its rendered config was kept."""
        return {**info.to_xcom(), "config_s3_uri": self.config_uri(context, CONFIG_FILE)}


class DeleteClusterOperator(_WaitingClusterOperator):
    """Idempotent delete (a static cluster is left alone); usable as an Airflow teardown task.

    :param cluster_name: the cluster to delete (default: the `name` in `cluster`), templated so it can
        come from the ensure task's XCom.
    :param export_fsx: export the cluster's FSx file systems to their S3 repository first.
    :param keep: leave the cluster as it is (teardown policy `never`: kept for debugging until the
        janitor's TTL); the task says so and deletes nothing.

    Only a cluster tagged with this `stack` (and, when `run_scoped`, this run's key) is deleted: any
    other is refused before anything is exported or deleted.
    """

    template_fields: Sequence[str] = aws_template_fields(
        *_ClusterOperator.template_fields, "cluster_name", "export_fsx", "keep"
    )
    ui_color = "#f4a6a6"

    def __init__(
        self,
        *,
        cluster_name: str | None = None,
        export_fsx: bool = False,
        keep: bool = False,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.cluster_name = cluster_name
        self.export_fsx = export_fsx
        self.keep = keep

    def _name(self) -> str | None:
        return self.cluster_name or (self.cluster or {}).get("name")

    def execute(self, context: Any) -> dict[str, Any]:
        from pcflow.cluster.providers import delete_cluster
        from pcflow.cluster.static import StaticProvider

        if self.keep:
            self.log.info("teardown policy keeps cluster %s; the janitor deletes it when it expires", self._name())
            return {"cluster_name": self._name(), "deleted": False, "kept": True}
        provider = self.cluster_provider  # ClusterNotOwned: an input error, not retried
        if isinstance(provider, StaticProvider) or not self.deferrable:
            owner = self.cluster_owner(context)
            return delete_cluster(provider, self._name(), owner=owner, export_fsx=bool(self.export_fsx), **self.waits)
        return self.export_then_delete(context)

    def cluster_owner(self, context: Any) -> tuple[str, str | None]:
        """The (stack, run) a cluster this task may delete carries in its tags."""
        return self.stack, self._tagging(context)["run"]

    def export_then_delete(self, context: Any) -> dict[str, Any]:
        """Deferrable all the way: each FSx export (when asked), then the stack's deletion. Called again
        after each wait; the exports are found again by their task key, so nothing rides in the
        deferral's kwargs and nothing is exported twice."""
        from pcflow.aws.storage import ACTIVE, data_repository_task_result
        from pcflow.cluster.parallelcluster import check_owner, export_attempts

        name = self._name()
        if not name:
            raise ConfigurationError("DeleteClusterOperator needs cluster_name (or a cluster section with a name)")
        provider = self.cluster_provider
        described = provider.hook.describe_cluster(name)
        if described is not None:
            check_owner(name, described, self.cluster_owner(context))
        exports = []
        if self.export_fsx:
            fsx = provider.clients("fsx")
            for task_id in provider.start_exports(name, described, task_key=self.export_key(context)):
                task = fsx.describe_data_repository_tasks(TaskIds=[task_id])["DataRepositoryTasks"][0]
                if task["Lifecycle"] in ACTIVE:
                    from pcflow.aws.waits import FsxDataRepositoryTaskTrigger

                    attempts = export_attempts(self.waiter_delay, at_least=self.waiter_max_attempts)
                    trigger = FsxDataRepositoryTaskTrigger(
                        task_id=task_id,
                        waiter_delay=self.waiter_delay,
                        waiter_max_attempts=attempts,
                        **self.trigger_aws_kwargs,
                    )
                    self.defer(trigger=trigger, method_name="export_complete")
                exports.append(data_repository_task_result(fsx, task_id))  # raises when it failed
        result = {**provider.delete_described(name, described), "exports": exports}
        if not result.pop("wait"):
            return result
        from pcflow.cluster.triggers import ClusterStackTrigger

        trigger = ClusterStackTrigger(
            stack_name=name, waiter_name="stack_delete_complete", **self.waits, **self.trigger_aws_kwargs
        )
        self.defer(trigger=trigger, method_name="execute_complete", kwargs={"result": result})

    def export_key(self, context: Any) -> str:
        """The key the run's FSx exports are found by again after each deferral (so none is started twice)."""
        from pcflow.aws.storage import EXPORT_BEFORE_DELETE
        from pcflow.naming import run_key_from_context

        return f"{run_key_from_context(context)}/{EXPORT_BEFORE_DELETE}"

    def export_complete(self, context: Any, event: dict[str, Any] | None = None) -> Any:
        """Back from an export's wait: on to the next step; a failed export fails the task and keeps the cluster
        (its file system holds data that is nowhere else yet)."""
        from pcflow.aws.storage import data_repository_task_result

        event = validate_event(event, task=self.task_id, required=("task_id",))
        if event["status"] != SUCCESS:  # FSx's reason, and the cluster is kept
            data_repository_task_result(self.cluster_provider.clients("fsx"), event["task_id"])
            raise WaitFailed(f"FSx export before deleting cluster {self._name()} failed: {event.get('message')}")
        return self.export_then_delete(context)

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None, result: dict | None = None) -> Any:
        """Back from the stack's deletion: the result, or a failure that says where to look (its DELETE_FAILED
        resources) and that a rerun continues."""
        require_success(
            event,
            task=self.task_id,
            what=f"deleting cluster {self._name()} (look at the stack's events in CloudFormation: fix or delete "
            "its DELETE_FAILED resources by hand, and run this task again)",
        )
        return result or {"cluster_name": self._name(), "deleted": True}
