"""The first task: refuse bad settings before anything costs money.

It resolves the settings (`settings.py`), then asks what only AWS can answer (does the instance type
exist here, do ParallelCluster's settings hold, does the account have what a first run trips on) and
prices the run against its budget; the document it returns is what every later stage reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import task

from pcflow.aws.clients import DEFAULT_AWS_CONN_ID
from pcflow.checks import setting_owner
from pcflow.errors import refused
from pcflow.pipeline.form import FORM_FIELDS, OTHER_FIELDS
from pcflow.pipeline.settings import (
    PLANNED_SECURITY_GROUP,
    PLANNED_SUBNET,
    VALIDATE_TASK,
    hyperparameter_cases,
    resolve_for_run,
    run_env,
    settings_for_cluster,
)

if TYPE_CHECKING:  # pydantic models: DAG files import this module when they are parsed
    from pcflow.resolved import PlannedRun


def check_against_aws(run: PlannedRun, aws_conn_id: str = DEFAULT_AWS_CONN_ID) -> None:
    """What only AWS can answer, asked before anything is created: does the instance type exist here?"""
    from botocore.exceptions import ClientError

    from pcflow.aws.clients import aws_client

    region, instance_type = run.region, run.instance_type
    ec2 = aws_client("ec2", aws_conn_id=aws_conn_id, region_name=region)
    try:
        ec2.describe_instance_types(InstanceTypes=[instance_type])
    except ClientError as exc:
        if exc.response["Error"]["Code"].startswith("InvalidInstanceType"):
            problem = f"{instance_type} is not offered in {region}; pick another type or region"
            raise refused("instance_type", problem, setting_owner(run, "instance_type")) from None
        raise


def planned_cluster(run: PlannedRun) -> Any:
    """The ParallelCluster cluster the run will create or adopt (`ClusterSpec`), None for a static one."""
    if run.cluster.provider != "parallelcluster":
        return None
    from pcflow.cluster.spec import ClusterSpec

    planned = {
        "head_subnet_id": PLANNED_SUBNET,
        "compute_subnet_ids": [PLANNED_SUBNET],
        "zone_subnet_ids": {zone: PLANNED_SUBNET for zone in run.network.zone_subnet_cidrs},
        "head_security_group_id": PLANNED_SECURITY_GROUP,
    }
    return ClusterSpec.parse(settings_for_cluster(run, planned, run.ami.base_image_id))


def check_cluster_settings(run: PlannedRun, aws_conn_id: str = DEFAULT_AWS_CONN_ID) -> None:
    """ParallelCluster settings checked before the network exists: name, counts, schema of pcflow's
    fields, and a GPU queue on a GPU instance type (EC2 DescribeInstanceTypes)."""
    if run.cluster.provider != "parallelcluster":
        return
    from pcflow.aws.clients import aws_client
    from pcflow.cluster.spec import ClusterSpecError, check_instance_type

    try:
        spec = planned_cluster(run)
        ec2 = aws_client("ec2", aws_conn_id=aws_conn_id, region_name=run.region)
        check_instance_type(ec2, spec.instance_type, gpus_required=spec.gpus_required, efa=spec.efa)
    except ClusterSpecError as exc:
        raise refused("cluster.config", str(exc), setting_owner(run, "cluster.config"), ClusterSpecError) from None


def account_preflight(run: PlannedRun, aws_conn_id: str = DEFAULT_AWS_CONN_ID) -> None:
    """What a first real run trips on (key pair, instance types in the zone, vCPU quota, the builder's
    instance profile, the pcluster CLI and Node.js), asked before anything is created: pcflow/preflight.py."""
    import functools

    from pcflow.aws.clients import aws_client
    from pcflow.preflight import Account, run_preflight

    @functools.cache
    def client(service: str) -> Any:
        return aws_client(service, aws_conn_id=aws_conn_id, region_name=run.region)

    run_preflight(Account(run, planned_cluster(run), client), skip=run.preflight.skip)


def training_form(params: dict[str, Any], dag: Any) -> dict[str, Any]:
    """The run's params less those its DAG declares for itself (a DAG the pipeline is a task group in):
    a conf field that is neither the DAG's nor the training form's is still refused."""
    own = set(getattr(dag, "params", None) or ()) - set(FORM_FIELDS) - set(OTHER_FIELDS)
    return {name: value for name, value in params.items() if name not in own}


@task(task_id=VALIDATE_TASK, multiple_outputs=False)
def validate_run(
    dated_partitions: bool = False, nightly: bool = False, params: dict[str, Any] | None = None, **context: Any
) -> dict[str, Any]:
    """Refuse bad settings before anything costs money; the resolved document is kept with the run.
    The checks run in order, those that ask nothing of AWS first; each names the field it refuses.
    `nightly`: the profile's `nightly.warm_start` applies when the conf names no `training.warm_start`.
    The warm start is resolved from the model events this task reads as its inlet (pcflow.warmstart)."""
    from pcflow.checks import (
        check_code,
        check_cost,
        check_dataset_source,
        check_hyperparameters,
        check_job,
        check_network,
        check_static_cluster,
        check_warm_start,
    )

    params = training_form(params or {}, context.get("dag"))
    run = resolve_for_run(params, context, dated_partitions=dated_partitions, nightly=nightly)
    check_job(run, env=run_env(params))  # env values stay out of the document (XCom)
    for check in (check_network, check_static_cluster, check_cluster_settings, check_dataset_source):
        check(run)
    run = check_code(run)  # pins the commit the code's schema is read at
    check_hyperparameters(run, cases=hyperparameter_cases(run, params))
    check_against_aws(run)
    account_preflight(run)
    warm = check_warm_start(run, context.get("inlet_events"))  # a model's bytes are read last, once all else holds
    estimate = check_cost(run)  # the price and maximum; refused above the budget
    priced = run.model_copy(update={"capacity_order": estimate.capacity_order})
    return resolved_document(priced, warm_start=warm, cost=estimate.cost)


def resolved_document(run: PlannedRun, *, warm_start: dict[str, Any], cost: dict[str, Any]) -> dict[str, Any]:
    """The first task's document: the planned run with its warm start and cost, checked against
    `ResolvedRun` and returned as XCom carries it (JSON)."""
    from pcflow.pipeline.resolved import dump, load

    return dump(load({**dump(run), "warm_start": warm_start, "cost": cost}))
