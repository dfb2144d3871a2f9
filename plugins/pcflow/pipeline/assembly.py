"""The training pipeline's stages, declared once and shared by every DAG (pretrain, nightly, sweep), or
as a task group inside someone else's DAG.

validate -> approve_cost (skipped below the profile's cost threshold) -> (network, bucket -> dataset)
-> image -> cluster -> (stage_in, ship_payload -> prepare_environment -> check_environment, prepare_image)
-> train -> metrics, with the cluster and (for run-scoped infrastructure) the network as setups whose
teardowns run even when training fails. Each phase is a function below; nothing here does I/O when a DAG
file is parsed: the functions only declare tasks.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from airflow.sdk import Asset, TaskGroup

from pcflow.alerts import FailureAlert
from pcflow.cluster.teardown import HANDLER_SET as PCLUSTER_HANDLERS
from pcflow.lineage import DATASET, MODEL
from pcflow.pipeline.settings import EXISTING_FILE_SYSTEM, RUN, RunEnv, task_value
from pcflow.pipeline.tasks import (
    check_environment,
    cluster_settings,
    dataset_source,
    ensure_dataset_bucket,
    lease_job_account,
    prepare_environment,
    prepare_image,
    release_job_account,
    ship_payload,
    stage_in,
    training_inputs,
    warm_start,
)
from pcflow.pipeline.validation import validate_run
from pcflow.timeouts import DEFAULT_STAGE_TIMEOUT, STAGE_TIMEOUTS

#: Every stage is idempotent, so a retry is always safe: it adopts what the failed attempt made. Training
#: is the exception (a retry costs GPU hours): Slurm requeues lost nodes itself, a user retries the rest.
DEFAULT_ARGS = {"retries": 2, "retry_delay": dt.timedelta(seconds=20), "retry_exponential_backoff": True}
#: The train task's retries are for the orchestrator's losses only: a worker killed while it submits, a wait
#: that lost track of its job (the scheduler fails the task; the retry adopts or re-attaches to the job, never
#: submits a second). A failed job fails the task for good (retry_failed_jobs=False): no second allocation
#: unless a person clears it. With no retry, such a loss failed the run and left its job running, unowned.
TRAIN_ARGS = {"retries": 2, "retry_failed_jobs": False}
#: What a DAG built with `build_training_pipeline` must set. No native rendering: Jinja's native mode
#: literal-evaluates strings (`'..''/''..''/x'` becomes `../../x`, `"0x10"` becomes 16); operators get
#: their values through `RUN`/`task_value` instead, as data. Every task's failure goes to the
#: notifier, which alerts as the profile's `alerts` section asks (pcflow.alerts.should_alert).
TRAINING_DAG_ARGS: dict[str, Any] = {
    "render_template_as_native_obj": False,
    "default_args": {**DEFAULT_ARGS, "on_failure_callback": FailureAlert()},
}
#: Every successful training run emits an event of its stack's own model Asset through this alias, with
#: the model's S3 URI and the metrics summary as extra: `pretrained_encoder(stack)` is what a consumer
#: DAG schedules on, so a demo stack's runs never update a production stack's model.
PRETRAINED_ENCODER = MODEL
#: Pools that bound spend across all runs of all pcflow DAGs (created from include/pools.json): a cluster
#: task holds a `pcflow_clusters` slot while it creates or adopts its cluster, a train task a `pcflow_trials`
#: slot while its Slurm job (or a sweep's job array) runs, deferred included. Teardowns take no slot.
CLUSTER_POOL = "pcflow_clusters"
TRIAL_POOL = "pcflow_trials"


def pretrained_encoder(stack: str) -> Asset:
    """The trained encoder of one stack (the Asset a DAG that uses the model schedules on)."""
    from pcflow.lineage import stack_asset

    return stack_asset(PRETRAINED_ENCODER.name, stack)


#: The stages `build_training_pipeline` returns (the others are the small tasks between them).
PUBLIC_STAGES = (
    *("validate", "approve_cost", "network", "validate_cluster", "dataset", "image", "cluster"),
    *("train", "metrics", "delete_cluster", "teardown"),
)


def build_training_pipeline(
    *, run_scoped: bool = True, sweep: bool = False, dated_partitions: bool = False, nightly: bool = False
) -> dict[str, Any]:
    """Declare the stages in the DAG (or task group) being defined; returns its tasks by name.

    `run_scoped=False` (nightly) keeps the network and cluster for the next run instead: no teardown, and
    every run stamps their `pcflow:expires` again (`teardown.keep_hours` past the latest time the run may
    end, pcflow.lifetime), so the next night adopts
    them and the janitor reaps them once the nights stop. The image is the stack's in both cases: reused
    by recipe, its expiry stamped again by every run that uses it. `nightly`: a run whose conf names no
    `training.warm_start` starts as the profile's `nightly.warm_start` says (`latest`: from the last
    successful night's model).
    """
    # The first task reads the stack's model events (its inlet) to resolve a warm start (pcflow.warmstart).
    run = validate_run.override(inlets=[PRETRAINED_ENCODER])(dated_partitions, nightly)
    stages: dict[str, Any] = {"validate": run}
    stages |= infrastructure(run, run_scoped=run_scoped)
    stages |= training(run, stages, sweep=sweep)
    if run_scoped:
        stages |= teardown(stages)
    # Operators read the resolved settings through templates: they must run after validate.
    tasks = {name: stage for name, stage in stages.items() if name in PUBLIC_STAGES}
    run >> [task for name, task in tasks.items() if name != "validate"]
    set_stage_timeouts(operator_of(stage) for name, stage in stages.items() if name != "train")
    return tasks


def infrastructure(run: Any, *, run_scoped: bool) -> dict[str, Any]:
    """Cost approval, network, data bucket and dataset, the config's dry run, image and cluster."""
    from pcflow.approval import AFTER_APPROVAL, CostApprovalOperator
    from pcflow.aws.network import EnsureNetworkOperator
    from pcflow.cluster.operators import EnsureClusterOperator, ValidateClusterConfigOperator

    ttl_hours = RUN.expiry.run_hours if run_scoped else RUN.expiry.kept_hours
    scope = {"run_scoped": run_scoped, "ttl_hours": ttl_hours}
    # Above the profile's threshold a person approves the cost first; below it, this task is skipped.
    approval = CostApprovalOperator(task_id="approve_cost", cost=RUN.cost)
    # The stack's network, shared by every run of every DAG of the stack: this run takes a reference to it,
    # kept in the data bucket (pcflow.aws.network_users), which its teardown gives back.
    network = EnsureNetworkOperator(
        task_id="network", network=RUN.network, references_bucket=RUN.dataset.bucket, ttl_hours=ttl_hours, **aws_args()
    )
    bucket = ensure_dataset_bucket.override(trigger_rule=AFTER_APPROVAL)(run)
    source = dataset_source.override(trigger_rule=AFTER_APPROVAL)(run)
    approval >> [bucket, source]
    bucket >> network
    dataset = dataset_stage(source)
    bucket >> dataset
    image = image_stage()
    # Validate before spend: ParallelCluster's dry run needs real subnets (it resolves them while loading
    # the config), so it runs once the network (free) exists, before the bake, the data or the cluster.
    # A run-scoped run makes a cluster of its own (named after its run key); the nightly keeps the stack's.
    dry_run_settings = cluster_settings.override(task_id="dry_run_settings")(run, network.output, own=run_scoped)
    dry_run = ValidateClusterConfigOperator(
        task_id="validate_cluster", cluster=dry_run_settings, **scope, **cluster_args()
    )
    bucket >> dry_run >> [dataset, image]
    settings = cluster_settings(run, network.output, image.output, own=run_scoped)
    cluster = EnsureClusterOperator(task_id="cluster", cluster=settings, pool=CLUSTER_POOL, **scope, **cluster_args())
    # The cluster is made once its data is in S3: a file system linked at creation lists the whole
    # partition (FSx imports the linked prefix's listing then), and a failed load makes no cluster.
    dataset >> cluster
    return {
        **{"approve_cost": approval, "network": network, "ensure_dataset_bucket": bucket, "dataset_source": source},
        **{"dataset": dataset, "image": image, "dry_run_settings": dry_run_settings, "validate_cluster": dry_run},
        **{"cluster_settings": settings, "cluster": cluster},
    }


def dataset_stage(source: Any) -> Any:
    """The dataset task: loads the run's source into its partition, and into a kept cluster's file system when
    there is one."""
    from pcflow.dataset.operators import DatasetLoadOperator

    return DatasetLoadOperator(
        task_id="dataset",
        source=source,
        bucket=RUN.dataset.bucket,
        prefix=RUN.dataset.prefix,
        partition=RUN.dataset.partition,
        mode=RUN.dataset.mode,
        # A cluster kept from an earlier run already has its file system: import the new partition.
        fsx_file_system_id=EXISTING_FILE_SYSTEM,
        fsx_owner=RUN.dataset.fsx_owner,  # FSx makes the SSH user the owner of what it imports
        outlets=[DATASET],  # new content in the partition: an event of the stack's dataset (pcflow.lineage)
        **aws_args(),
    )


def image_stage() -> Any:
    """The image task: bakes (or reuses) the run's AMI inside the run's network, under the recipe's bake lock
    in the stack's data bucket (pcflow.aws.ami.BakeLocking)."""
    from pcflow.aws.ami import BakeImageOperator

    return BakeImageOperator(
        task_id="image",
        pcluster_version=RUN.ami.pcluster_version,
        bootstrap_script_path=RUN.ami.bootstrap_script,
        instance_profile=RUN.ami.instance_profile,
        subnet_id=task_value("network", "head_subnet_id"),
        security_group_ids=[task_value("network", "cluster_security_group_id")],
        instance_type=RUN.ami.instance_type,
        base_image_id=RUN.ami.base_image_id,
        base_image_owners=RUN.ami.base_image_owners,
        os=RUN.ami.os,
        wait_for_ssm_agent=RUN.ami.wait_for_ssm_agent,
        enabled=RUN.ami.enabled,
        environment_file=RUN.ami.environment,
        ttl_hours=RUN.expiry.kept_hours,
        # The recipe's bake lock, beside the network's: of runs that start at once, one bakes, the rest adopt.
        lock_bucket=RUN.dataset.bucket,
        **aws_args(),
    )


def aws_args() -> dict[str, Any]:
    """What every AWS operator of the pipeline is given alike: the run's stack, and its region (the profile's,
    where the first task checked and priced the run), so that no stage builds in the AWS connection's
    region instead. The janitor and the UI, which have no profile, work in the connection's region."""
    return {"stack": RUN.stack, "region_name": RUN.region}


def cluster_args() -> dict[str, Any]:
    """What every cluster operator of the pipeline (dry run, ensure, delete) is given alike: the AWS
    operators' arguments (the run's region reaches the pcluster CLI's `--region`, the rendered config's
    `Region:`), and the cluster's provider, SSH connection, validators and config bucket."""
    return {
        **aws_args(),
        "provider": RUN.cluster.provider,
        "ssh_conn_id": RUN.cluster.ssh_conn_id,
        "suppress_validators": RUN.cluster.suppress_validators,
        "config_bucket": RUN.dataset.bucket,
    }


def training(run: Any, stages: dict[str, Any], *, sweep: bool) -> dict[str, Any]:
    """The data and code on the cluster, the Slurm job (a job array for a sweep), and its metrics."""
    from pcflow.metrics.outputs import MODEL_FILE
    from pcflow.slurm.operators import SlurmArrayJobOperator, SlurmJobOperator

    cluster = stages["cluster"].output
    data_dir = stage_in(run, cluster, stages["dataset"].output)
    payload = ship_payload(run, cluster)
    prepared = prepare_environment(run, cluster, payload)
    environment = check_environment(run, cluster, prepared)
    image = prepare_image(run, cluster, prepared)  # the run's container, imported once per digest; the preflight
    account = lease_job_account(run, cluster)
    inputs = training_inputs(run, cluster, data_dir, RUN.trials if sweep else None, account)
    warm = warm_start(run, cluster, account)  # the model it starts from, verified, read-only on the cluster
    job = {
        "program": RUN.training.program,
        "launcher": RUN.training.launcher,
        "python": image["python"],  # the image's with a container, else the run's own environment's or training.python
        "allocation": RUN.training.allocation,
        "env": RunEnv(),
        "secret_env": RUN.training.secrets,  # references: the trigger hides their values in the log
        "head_node": inputs["head_node"],
        "shared_root": inputs["shared_root"],
        "max_restarts": RUN.training.max_restarts,
        "early_stopping": RUN.early_stopping,
        "pending_timeout": RUN.training.pending_timeout_s,
        "payload_dir": payload["dir"],
        "hyperparameter_args": RUN.training.hyperparameter_args,
        "container": image,
        "warm_start": warm["path"],  # $PCFLOW_WARM_START; None without a warm start
        "budget": RUN.cost,  # the wait logs the cost so far and stops the job at the budget
        "capacity": RUN.capacity_order,  # a job pending for insufficient capacity moves to the next option
        "fabric_env": inputs["fabric_env"],  # EFA's libfabric settings where the cluster has EFA
        "inlets": [DATASET],  # what it trains on; the model's event names the partition (pcflow.lineage)
    }
    if sweep:
        # Up to sweep.parallel trials at once (the array's `%` throttle), each on nodes of its own.
        trials = {"trials": inputs["trials"], "max_parallel": RUN.sweep.parallel, "min_success_ratio": 0.5}
        train = SlurmArrayJobOperator(task_id="train", pool=TRIAL_POOL, **TRAIN_ARGS, **trials, **job)
    else:
        hyperparameters = inputs["hyperparameters"]
        # What the payload's program leaves when it completes: a job that completed without them fails here.
        outputs = (MODEL_FILE, "metrics.jsonl")
        train = SlurmJobOperator(
            task_id="train", hyperparameters=hyperparameters, outputs=outputs, pool=TRIAL_POOL, **TRAIN_ARGS, **job
        )
    [inputs, environment, image, warm] >> train
    provenance = {"prepare_environment": prepared, "ship_payload": payload, "warm_start": warm}
    metrics = metrics_stage(train, {**stages, **provenance}, inputs["head_node"], sweep=sweep)
    # The account back to the pool once the run is done with the cluster, whatever became of training.
    release = release_job_account(cluster, account)
    metrics >> release.as_teardown(setups=account)
    return {
        **{"stage_in": data_dir, "ship_payload": payload, "prepare_environment": prepared},
        **{"check_environment": environment, "training_inputs": inputs, "prepare_image": image},
        **{"lease_job_account": account, "train": train, "metrics": metrics, "release_job_account": release},
        "warm_start": warm,
    }


def metrics_stage(train: Any, stages: dict[str, Any], head_node: Any, *, sweep: bool) -> Any:
    """The metrics task (the leaderboard for a sweep): harvests what the train task left, priced with the run's
    region and cluster."""
    from pcflow.metrics.operators import HarvestMetricsOperator, SweepLeaderboardOperator

    harvest = SweepLeaderboardOperator if sweep else HarvestMetricsOperator
    return harvest(
        task_id="metrics",
        job=train.output,
        bucket=RUN.dataset.bucket,
        objective=RUN.objective,
        instance_type=RUN.instance_type,
        capacity_type=RUN.capacity_type,
        nodes=RUN.training.nodes,
        metric_definitions=RUN.metrics.metric_definitions,
        cluster_provider=RUN.cluster.provider,
        cluster=stages["cluster_settings"],  # ParallelCluster's head node and FSx are priced from these
        cost_before=RUN.cost,
        cloudwatch=RUN.metrics.publish_cloudwatch,
        head_node=head_node,
        dataset=stages["dataset"].output,
        environment=stages["prepare_environment"],  # provenance: the environment's id, built or reused
        code=stages["ship_payload"],  # the code it trained: in its summary, report and the model's event
        warm_start=stages["warm_start"],  # the model it started from: the same three places
        inlets=[DATASET],
        outlets=[PRETRAINED_ENCODER],
        **aws_args(),  # priced with the run's region's prices
    )


def teardown(stages: dict[str, Any]) -> dict[str, Any]:
    """The run's cluster, then the rest of what it tagged, as teardowns of their setups: they run when
    training fails too. Each alerts when it fails, in whatever DAG (or task group) holds it: what it did
    not delete keeps billing (its own notifier, which the DAG's default arguments do not replace)."""
    from pcflow.aws.network import ReleaseNetworkOperator
    from pcflow.aws.teardown import TeardownOperator
    from pcflow.cluster.operators import DeleteClusterOperator

    alert = {"on_failure_callback": FailureAlert()}
    delete_cluster = DeleteClusterOperator(
        task_id="delete_cluster",
        cluster=stages["cluster_settings"],
        cluster_name=task_value("cluster", "name"),
        export_fsx=RUN.teardown.export_fsx,
        keep=RUN.keep_resources,
        run_scoped=True,  # deletes only a cluster tagged with this stack and run
        **cluster_args(),
        **alert,
    )
    [stages["metrics"], stages["release_job_account"]] >> delete_cluster.as_teardown(setups=stages["cluster"])
    remains = TeardownOperator(
        task_id="teardown",
        run=RUN.run_key,
        handler_sets=(PCLUSTER_HANDLERS, "ec2", "fsx"),
        dry_run=RUN.keep_resources,
        **aws_args(),
        **alert,
    )
    delete_cluster >> remains.as_teardown(setups=stages["network"])
    # Last, the run's reference to the stack's network: the network goes with its last user (aws/network_users.py).
    release = ReleaseNetworkOperator(
        task_id="release_network",
        references_bucket=RUN.dataset.bucket,
        dry_run=RUN.keep_resources,
        **aws_args(),
        **alert,
    )
    remains >> release.as_teardown(setups=stages["network"])
    return {"delete_cluster": delete_cluster, "teardown": remains, "release_network": release}


def operator_of(stage: Any) -> Any:
    """The operator behind a stage (a @task call returns its XComArg)."""
    return getattr(stage, "operator", stage)


def set_stage_timeouts(operators: Iterable[Any]) -> None:
    """Give each stage its execution timeout (STAGE_TIMEOUTS, else the default), so a hung stage fails instead
    of holding a slot for ever."""
    for operator in operators:
        operator.execution_timeout = STAGE_TIMEOUTS.get(operator.label, DEFAULT_STAGE_TIMEOUT)


def training_pipeline_group(
    group_id: str = "training",
    *,
    run_scoped: bool = True,
    sweep: bool = False,
    dated_partitions: bool = False,
    tooltip: str = "pcflow: validate, infrastructure, training, metrics, teardown",
) -> TaskGroup:
    """The pipeline as one task group in a DAG of your own, to put your tasks before and after it:
    `first >> training_pipeline_group() >> last`. Your DAG's params must include the training form
    (`training_params()`, plus `sweep_params()` for a sweep): the group's first task reads them, and
    leaves your DAG's other params alone. Its tasks retry as the pipeline's DAGs do (`DEFAULT_ARGS`)."""
    with TaskGroup(group_id, tooltip=tooltip, default_args=DEFAULT_ARGS) as group:
        build_training_pipeline(run_scoped=run_scoped, sweep=sweep, dated_partitions=dated_partitions)
    return group
