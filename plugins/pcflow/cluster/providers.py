"""Choose the cluster provider by the profile's name ("static" | "parallelcluster"), and the plain
(blocking) function API: `validate_cluster`, `ensure_cluster`, `delete_cluster`. DAGs do not change
between providers: both return `ClusterInfo.to_xcom()`."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from pcflow.aws.clients import DEFAULT_AWS_CONN_ID
from pcflow.cluster.parallelcluster import ParallelClusterProvider
from pcflow.cluster.pcluster import ParallelClusterHook
from pcflow.cluster.spec import ClusterSpec
from pcflow.cluster.static import StaticProvider

PROVIDERS = ("static", "parallelcluster")


def make_provider(
    name: str,
    *,
    cluster: Mapping[str, Any] | None = None,
    aws_conn_id: str | None = DEFAULT_AWS_CONN_ID,
    region_name: str | None = None,
    verify: bool | str | None = None,
    botocore_config: Mapping[str, Any] | None = None,
    ssh_conn_id: str | None = None,
    pcluster_path: str | None = None,
    suppress_validators: Sequence[str] = (),
    require_host_key: bool = True,
) -> StaticProvider | ParallelClusterProvider:
    """The provider `name`; `cluster` is the spec's cluster section (static: partition, gpus_required...).
    The AWS settings (connection, region, TLS verification, botocore config) reach every client and the
    pcluster CLI's environment."""
    cluster = dict(cluster or {})
    if name == "static":
        allowed = {"name", "partition", "gpus_required", "min_nodes"}
        unknown = sorted(set(cluster) - allowed)
        if unknown:
            raise ValueError(f"unknown static cluster setting(s) {unknown}; allowed: {sorted(allowed)}")
        return StaticProvider(
            ssh_conn_id=ssh_conn_id or "slurm_default",
            cluster_name=cluster.get("name"),
            partition=cluster.get("partition"),
            gpus_required=bool(cluster.get("gpus_required", False)),
            min_nodes=int(cluster.get("min_nodes", 1)),
        )
    if name == "parallelcluster":
        from pcflow.aws.clients import aws_client

        connection = {"aws_conn_id": aws_conn_id, "region_name": region_name, "verify": verify}
        clients_cache: dict[str, Any] = {}

        def clients(service: str) -> Any:
            if service not in clients_cache:
                clients_cache[service] = aws_client(service, **connection, botocore_config=botocore_config)
            return clients_cache[service]

        hook = ParallelClusterHook(**connection, botocore_config=botocore_config, pcluster_path=pcluster_path)
        return ParallelClusterProvider(
            hook=hook,
            clients=clients,
            ssh_conn_id=ssh_conn_id or "pcluster_default",
            suppress_validators=suppress_validators,
            require_host_key=require_host_key,
        )
    raise ValueError(f"unknown cluster provider {name!r}: choose one of {', '.join(PROVIDERS)}")


def validate_cluster(
    provider: StaticProvider | ParallelClusterProvider,
    cluster: Mapping[str, Any] | ClusterSpec | None,
    *,
    stack: str,
    run: str | None = None,
    ttl: dt.timedelta | None = None,
    dag_run: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """ParallelCluster: spec + EC2 instance-type checks, then `create-cluster --dryrun true`.
    Static: the health check (nothing is created either way)."""
    if isinstance(provider, StaticProvider):
        return {"provider": provider.name, "cluster": provider.ensure().to_xcom()}
    spec = ClusterSpec.parse(cluster)
    rendered = provider.render(spec, stack=stack, run=run, ttl=ttl, dag_run=dag_run)
    return provider.validate(spec, rendered)


def _wait(provider: ParallelClusterProvider, stack_name: str, waiter: str, delay: int, attempts: int) -> None:
    from pcflow.aws.clients import wait_logged

    try:
        wait_logged(
            provider.clients("cloudformation").get_waiter(waiter),
            {"StackName": stack_name},
            what=f"cluster stack {stack_name}",
            status_args=["Stacks[0].StackStatus"],
            delay=delay,
            max_attempts=attempts,
        )
    except Exception:  # a failed stack is diagnosed by `finish` from describe-cluster
        if waiter == "stack_delete_complete":
            raise


def ensure_cluster(
    provider: StaticProvider | ParallelClusterProvider,
    cluster: Mapping[str, Any] | ClusterSpec | None,
    *,
    stack: str,
    run: str | None = None,
    ttl: dt.timedelta | None = None,
    dag_run: tuple[str, str] | None = None,
    waiter_delay: int = 30,
    waiter_max_attempts: int = 240,
) -> dict[str, Any]:
    """Blocking ensure (the operator defers instead); returns `ClusterInfo.to_xcom()`."""
    if isinstance(provider, StaticProvider):
        return provider.ensure().to_xcom()
    spec = ClusterSpec.parse(cluster)
    rendered = provider.render(spec, stack=stack, run=run, ttl=ttl, dag_run=dag_run)
    step = provider.start(spec, rendered)
    if step.waiter:
        _wait(provider, step.stack_name, step.waiter, waiter_delay, waiter_max_attempts)
    return provider.finish(spec, step.action).to_xcom()


def delete_cluster(
    provider: StaticProvider | ParallelClusterProvider,
    cluster_name: str | None,
    *,
    owner: tuple[str | None, str | None] | None = None,
    export_fsx: bool = False,
    waiter_delay: int = 30,
    waiter_max_attempts: int = 240,
) -> dict[str, Any]:
    """Blocking, idempotent delete; a static cluster is never deleted. `owner` (stack, run): the cluster
    must carry these tags or it is refused (`ClusterNotOwned`); None only for an admin's own cleanup."""
    if isinstance(provider, StaticProvider):
        return provider.delete()
    if not cluster_name:
        raise ValueError("delete_cluster needs the cluster name")
    result = provider.start_delete(cluster_name, owner=owner, export_fsx=export_fsx, export_delay=waiter_delay)
    if result["wait"]:
        _wait(provider, cluster_name, "stack_delete_complete", waiter_delay, waiter_max_attempts)
    return {k: v for k, v in result.items() if k != "wait"}
