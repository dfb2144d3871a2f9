"""The pipeline's small tasks: the glue between the operators (the data bucket, where the data comes from,
the cluster's settings, the data and code on the cluster, what the train task needs to reach it).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow.sdk import task

from pcflow.aws.clients import DEFAULT_AWS_CONN_ID
from pcflow.pipeline.settings import settings_for_cluster
from pcflow.slurm.head_node import HeadNode

if TYPE_CHECKING:  # pydantic models: DAG files import this module when they are parsed
    from pcflow.resolved import ResolvedRun


def typed(document: ResolvedRun | Mapping[str, Any]) -> ResolvedRun:
    """The first task's document as each task receives it from XCom (JSON), validated once into the model
    the task hands to what it calls (`pcflow.pipeline.resolved.load`): a setting read by attribute, never by
    key. Imported here, when a task runs, not when a DAG file is parsed (no pydantic at parse time)."""
    from pcflow.pipeline.resolved import load

    return load(document)


@task(multiple_outputs=False)
def ensure_dataset_bucket(document: dict[str, Any]) -> dict[str, Any]:
    """The dataset/report bucket stacks share: created with pcflow's settings (versioned, so a manifest
    names the exact bytes it lists while a later load replaces keys), or adopted as it is; never
    re-tagged, and this stack recorded as one of its users (`pcflow.aws.buckets`)."""
    from pcflow.aws.clients import aws_client
    from pcflow.aws.storage import ABORT_INCOMPLETE_UPLOADS, EXPIRE_REPLACED_VERSIONS, ensure_shared_bucket

    run = typed(document)
    s3 = aws_client("s3", aws_conn_id=DEFAULT_AWS_CONN_ID, region_name=run.region)
    rules = [ABORT_INCOMPLETE_UPLOADS, EXPIRE_REPLACED_VERSIONS]
    return ensure_shared_bucket(
        s3, run.dataset.bucket, region=run.region, stack=run.stack, versioning=True, lifecycle_rules=rules
    )


@task
def dataset_source(document: dict[str, Any]) -> str:
    """Where the loader reads from: a built-in dataset (pcflow.datasource) becomes its files on this
    worker (the digits as PNG class folders, cached), anything else is read where it is."""
    from pcflow.datasource import parse_source

    source = parse_source(typed(document).dataset.source)
    if source.kind != "builtin":
        return source.text
    import os
    from pathlib import Path

    from pcflow.dataset.digits import materialize_digits

    name = source.builtin_name()
    cache = Path(os.environ.get("PCFLOW_CACHE_DIR", Path.home() / ".cache" / "pcflow")) / name
    return str(materialize_digits(cache))


def planned_image_id(run: ResolvedRun, aws_conn_id: str = DEFAULT_AWS_CONN_ID) -> str | None:
    """The image a dry run checks the config against before anything is baked: the bake's base image
    (the baked image derives from it: same OS, same ParallelCluster version, so the same validators)."""
    ami = run.ami
    if not ami.enabled or ami.base_image_id:
        return ami.base_image_id
    from pcflow.aws.ami import find_base_image
    from pcflow.aws.clients import aws_client

    ec2 = aws_client("ec2", aws_conn_id=aws_conn_id, region_name=run.region)
    return find_base_image(
        ec2, region=run.region, pcluster_version=ami.pcluster_version, os=ami.os, owners=ami.base_image_owners
    )


@task(multiple_outputs=False)
def cluster_settings(
    document: dict[str, Any], network: dict[str, Any], image: dict[str, Any] | None = None, own: bool = False
) -> dict[str, Any]:
    """The settings the cluster is made with; without `image` (the dry run, before the bake), the
    settings with the image the bake will start from. `own`: the run's own cluster, not the stack's."""
    run = typed(document)
    image_id = (image or {}).get("image_id") if image is not None else planned_image_id(run)
    return settings_for_cluster(run, network, image_id, own=own)


@task
def stage_in(document: dict[str, Any], cluster: dict[str, Any], dataset: dict[str, Any]) -> str:
    """The partition where the cluster's jobs read it (copied for a static cluster; FSx does it on AWS)."""
    import logging

    from pcflow.aws.clients import aws_client
    from pcflow.dataset.stage_in import copy_partition, data_dir_on_cluster, datasets_root
    from pcflow.slurm.hook import SlurmHook

    data_dir = data_dir_on_cluster(cluster, dataset)
    if cluster["provider"] == "static":
        hook = SlurmHook(HeadNode.from_cluster(cluster))
        hook.make_private_dirs(datasets_root(cluster))  # the copies: jobs read theirs through their run's view
        s3 = aws_client("s3", aws_conn_id=DEFAULT_AWS_CONN_ID, region_name=typed(document).region)
        log = logging.getLogger("airflow.task")
        copy_partition(s3, hook, bucket=dataset["bucket"], root=dataset["root"], dest=data_dir, log=log)
        hook.close()
    return data_dir


def shared_root_of(cluster: dict[str, Any], hook: Any) -> str | None:
    """Where the cluster keeps pcflow's files: what its ensure task found, else the SSH connection's extra."""
    return cluster.get("shared_root") or (hook.shared_root if hook is not None else None)


def partition_view(head_node: HeadNode, shared_root: str | None, data_dir: str) -> str:
    """The run's view of its staged partition in its run directory (pcflow.dataset.stage_in.link_partition),
    the run's directory made first, in its job account's group."""
    from airflow.sdk import get_current_context

    from pcflow.dataset.stage_in import link_partition
    from pcflow.naming import run_key_from_context
    from pcflow.slurm.hook import SlurmHook
    from pcflow.slurm.spec import under_runs

    hook = SlurmHook(head_node)
    try:
        run_dir = under_runs(
            shared_root_of({"shared_root": shared_root}, hook), run_key_from_context(get_current_context())
        )
        hook.make_run_dirs(run_dir)
        return link_partition(hook, data_dir, run_dir)
    finally:
        hook.close()


#: What ship_payload returns when the run has neither a payload nor code of its own.
NO_CODE = {
    **{"name": None, "digest": None, "dir": None, "reused": False, "source": None, "url": None, "commit": None},
    **{"dirty": None, "bytes": 0, "files": 0, "uploaded_bytes": 0},
}


@task(multiple_outputs=True)
def ship_payload(document: dict[str, Any], cluster: dict[str, Any]) -> dict[str, Any]:
    """The run's code on the cluster, by content hash (reused when there), and its provenance for the run
    summary: the profile's payload, or the run's own code (`training.code`: pcflow.code.deliver, which
    also puts its bundle in the stack's bucket once)."""
    run = typed(document)
    training = run.training
    if not training.payload and not training.code:
        return dict(NO_CODE)
    import logging

    from pcflow.code.deliver import deliver, provenance
    from pcflow.slurm.hook import SlurmHook
    from pcflow.slurm.payload import build_archive, ship

    log = logging.getLogger("airflow.task")
    hook = SlurmHook(HeadNode.from_cluster(cluster))
    try:
        shared_root = shared_root_of(cluster, hook)
        if training.code:
            from pcflow.aws.clients import aws_client

            s3 = aws_client("s3", aws_conn_id=DEFAULT_AWS_CONN_ID, region_name=run.region)
            return deliver(run, hook, shared_root=shared_root, s3=s3, log=log)
        archive = build_archive(training.payload)
        shipped = ship(hook, archive, shared_root=shared_root, log=log)
        return {**shipped, **provenance(archive), "uploaded_bytes": 0}
    finally:
        hook.close()


@task(multiple_outputs=True)
def prepare_environment(document: dict[str, Any], cluster: dict[str, Any], code: dict[str, Any]) -> dict[str, Any]:
    """The run's own environment, from `training.requirements` in its staged code: built once per cluster
    and reused by every later run whose inputs hash the same (pcflow.slurm.envs); without requirements,
    `training.python` as it is, nothing built."""
    training = typed(document).training
    if not training.requirements:
        return {"id": None, "dir": None, "python": training.python, "built": False, "build_s": 0.0}
    import logging

    from pcflow.slurm.envs import prepare
    from pcflow.slurm.hook import SlurmHook

    hook = SlurmHook(HeadNode.from_cluster(cluster))
    try:
        return prepare(
            hook,
            code_dir=code["dir"],
            requirements=training.requirements,
            python=training.python,
            settings=training.environment.model_dump(mode="json"),
            shared_root=shared_root_of(cluster, hook),
            log=logging.getLogger("airflow.task"),
        )
    finally:
        hook.close()


@task(multiple_outputs=True)
def check_environment(document: dict[str, Any], cluster: dict[str, Any], prepared: dict[str, Any]) -> dict[str, Any]:
    """The environment the job runs in (the run's own, `prepare_environment`'s, else `training.python`'s),
    verified against the record written when it was built (pcflow.slurm.environment), and a layered one's
    base too, whose packages it imports: a run whose environment does not match stops here, not retried."""
    training = typed(document).training
    if not training.payload and not training.code:  # `program` as given, interpreter included
        return {"dir": None, "record": None, "full_check": False, "check_s": 0.0}
    import logging

    from pcflow.slurm.environment import verify_environment
    from pcflow.slurm.hook import SlurmHook

    hook = SlurmHook(HeadNode.from_cluster(cluster))
    log = logging.getLogger("airflow.task")
    try:
        shared_root = shared_root_of(cluster, hook)
        if prepared.get("id") and prepared.get("base") == "layered":
            verify_environment(hook, training.python, shared_root=shared_root, log=log)
        return verify_environment(hook, prepared["python"], shared_root=shared_root, log=log)
    finally:
        hook.close()


@task(multiple_outputs=True)
def prepare_image(document: dict[str, Any], cluster: dict[str, Any], environment: dict[str, Any]) -> dict[str, Any]:
    """The run's container image on the cluster, once per digest (pcflow.slurm.images): first the
    preflight (the cluster's srun must know the runtime's option; a cluster that cannot run it refuses
    the run here, not retried), then the digest the reference names now and its import, or the one an
    earlier run left. Returns what the train task puts in its srun, and the provenance (digest, imported).
    No container: the interpreter of `environment` (prepare_environment's: the run's own, else
    `training.python`), nothing else."""
    run = typed(document)
    container = run.training.container
    if container is None:
        return {"reference": None, "digest": None, "imported": False, "python": environment["python"]}
    import logging
    import time

    from pcflow.imagerefs import parse_image
    from pcflow.slurm import images
    from pcflow.slurm.hook import SlurmHook

    settings = run.cluster.containers
    ref = parse_image(container.image)
    log = logging.getLogger("airflow.task")
    hook = SlurmHook(HeadNode.from_cluster(cluster))
    try:
        images.check_cluster_runs(hook, settings.runtime)
        shared_root = shared_root_of(cluster, hook)
        started = time.monotonic()
        if settings.runtime == "oci":
            digest = images.layout_digest(hook, ref)
            found = images.import_oci(hook, ref, digest, shared_root, log)
            images.ensure_mount_points(hook, found["path"], [shared_root, *settings.mounts])
            found["env"] = images.image_env(hook, found["path"])
        else:
            digest, password = registry_pull(ref, settings.registry_conn_id or DEFAULT_AWS_CONN_ID)
            credentials = images.enroot_credentials(ref.registry, password) if password else None
            found = images.import_sqsh(hook, ref, digest, shared_root, credentials=credentials, log=log)
    finally:
        hook.close()
    mounts = [{"path": path} for path in settings.mounts]  # the run's own directories: the train task's
    return {
        **found,
        **{"reference": ref.text, "digest": digest, "runtime": settings.runtime, "python": container.python},
        **{"shared_root": shared_root, "mounts": mounts, "import_s": round(time.monotonic() - started, 3)},
    }


def registry_pull(ref: Any, aws_conn_id: str) -> tuple[str, str | None]:
    """The digest a registry reference names now, and a pull token: ECR's from the Airflow AWS connection;
    another registry's image must be pinned by digest (@sha256:...) and is pulled without credentials."""
    from pcflow.slurm.images import ECR_HOST

    if match := ECR_HOST.fullmatch(ref.registry or ""):
        from pcflow.aws.ecr import ecr_image

        return ecr_image(ref, aws_conn_id, host_match=match)
    if not ref.digest:
        from pcflow.errors import profile_setting, refused

        raise refused("training.container", f"{ref.text}: outside ECR, name the image by digest", profile_setting())
    return ref.digest, None


#: A run whose cluster has no free job account waits for one, up to an hour (NoJobAccount is retried).
ACCOUNT_WAIT = {"retries": 60, "retry_delay": dt.timedelta(minutes=1)}


@task(**ACCOUNT_WAIT)
def lease_job_account(document: dict[str, Any], cluster: dict[str, Any]) -> str | None:
    """The account this run's jobs run as, leased from the cluster's pool for as long as the run runs
    (pcflow.slurm.accounts); None when the profile runs jobs as the SSH user (no `cluster.job_user`). With
    every account held by other running runs, it waits for one (ACCOUNT_WAIT); one held by a run that is
    over (Airflow says so) without having released it is reclaimed."""
    settings = typed(document).cluster
    if not settings.job_user:
        return None
    from airflow.sdk import get_current_context

    from pcflow.aws.janitor import UNFINISHED, task_run_state
    from pcflow.naming import dag_run_of, run_key_from_context
    from pcflow.patterns import job_account_names
    from pcflow.slurm.accounts import lease
    from pcflow.slurm.hook import SlurmHook

    context = get_current_context()
    run_state = task_run_state(context["ti"])
    hook = SlurmHook(HeadNode.from_cluster(cluster))
    try:
        names = job_account_names(settings.job_user, settings.job_accounts)
        return lease(
            hook,
            shared_root_of(cluster, hook),
            run_key_from_context(context),
            names,
            dag_run=dag_run_of(context),
            run_is_over=lambda dag_id, run_id: run_state(dag_id, run_id) not in UNFINISHED,
        )
    finally:
        hook.close()


@task(multiple_outputs=False)
def release_job_account(cluster: dict[str, Any] | None, account: str | None) -> dict[str, Any]:
    """The run's account back to the pool, its directory closed to it first (the next run leasing that
    account cannot read what this one left); kept while a job of it still runs, saying so."""
    if not account or not cluster:
        return {"account": account, "released": False, "still_running": []}
    import logging

    from airflow.sdk import get_current_context

    from pcflow.naming import run_key_from_context
    from pcflow.slurm.accounts import release
    from pcflow.slurm.hook import SlurmHook

    hook = SlurmHook(HeadNode.from_cluster(cluster))
    try:
        key = run_key_from_context(get_current_context())
        still = release(hook, shared_root_of(cluster, hook), key, account)
    finally:
        hook.close()
    if still:
        logging.getLogger("airflow.task").warning(
            "Job account %s stays leased to this run: its Slurm jobs %s still run. It is released when this "
            "task runs again after they end (clear it), or by an admin removing its lease.",
            account,
            ", ".join(still),
        )
    return {"account": account, "released": not still, "still_running": still}


@task(multiple_outputs=True)
def warm_start(document: dict[str, Any], cluster: dict[str, Any], job_account: str | None = None) -> dict[str, Any]:
    """The model the run starts from (`training.warm_start`, resolved by the first task against its run's
    record), downloaded again through the verified loader, put read-only into the run's directory on the
    cluster and checked there against the recorded sha256 (pcflow.warmstart). Returns its provenance and
    `path` on the cluster, which the train task gives the job as $PCFLOW_WARM_START; `path` None without one.
    Bytes that changed since the first task checked them fail this task without retries."""
    run = typed(document)
    resolved = run.warm_start.model_dump(mode="json")
    if not run.warm_start.uri:
        return {**resolved, "path": None}
    import tempfile

    from pcflow.aws.clients import aws_client
    from pcflow.slurm.hook import SlurmHook
    from pcflow.slurm.spec import under_runs
    from pcflow.warmstart import install, verify

    s3 = aws_client("s3", aws_conn_id=DEFAULT_AWS_CONN_ID, region_name=run.region)
    hook = SlurmHook(HeadNode.from_cluster(cluster).running_jobs_as(job_account))
    try:
        with tempfile.TemporaryDirectory(prefix="pcflow-warm-start-") as directory:
            local = verify(s3, resolved, directory)
            path = install(hook, local, resolved, under_runs(shared_root_of(cluster, hook), run.run_key))
    finally:
        hook.close()
    return {**resolved, "path": path}


@task(multiple_outputs=True)
def training_inputs(
    document: dict[str, Any],
    cluster: dict[str, Any],
    data_dir: str,
    trials: list[dict] | None = None,
    job_account: str | None = None,
) -> dict[str, Any]:
    """Where and how to reach the cluster, the data's path there and what its network needs in the job's
    environment, for the train task (DATA_DIR is one of runspec.RESERVED_HYPERPARAMETERS: the first task
    refused it in the profile, conf, trials and grid)."""
    from pcflow.runspec import DATA_DIR

    head_node = HeadNode.from_cluster(cluster).running_jobs_as(job_account)
    if job_account:  # the partition, seen through its run's directory (the partitions are the SSH user's)
        data_dir = partition_view(head_node, shared_root_of(cluster, None), data_dir)
    hyperparameters = {**typed(document).training.hyperparameters, DATA_DIR: data_dir}
    return {
        # Its jobs run as the account it leased from the cluster's pool (lease_job_account).
        "head_node": head_node.as_dict(),
        "shared_root": cluster.get("shared_root"),
        "hyperparameters": hyperparameters,
        "trials": [{**hyperparameters, **trial} for trial in (trials or [])],
        "fabric_env": dict(cluster.get("fabric_env") or {}),  # EFA's libfabric settings (pcflow.cluster.fabric)
    }
