"""The training pipeline's stages, composed once and shared by every DAG (pretrain, nightly, sweep).

The first task checks the run's conf against what the profile lets a trigger user change, resolves
the settings (profile + Params/conf) into one validated document, runs every check a later stage
would run, and returns the document. Later operators receive its values as data (`run_value`: picked
in Python when the operator renders its fields), never as text rendered again by Jinja, so a value
reaches its stage exactly as validated. Nothing here does I/O when a DAG file is parsed beyond listing
the profiles: the functions only declare tasks.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import Asset, AssetAlias, Param, task
from airflow.sdk.exceptions import AirflowFailException

from pcflow.lineage import DATASET
from pcflow.paths import default_profile, profile_names
from pcflow.patterns import INSTANCE_TYPE, PARTITION
from pcflow.values import Returned

#: Every stage is idempotent, so a retry is always safe: it adopts what the failed attempt made. Training
#: is the exception (a retry costs GPU hours): Slurm requeues lost nodes itself, a user retries the rest.
DEFAULT_ARGS = {"retries": 2, "retry_delay": dt.timedelta(seconds=20), "retry_exponential_backoff": True}
#: What a DAG built with `build_training_pipeline` must set. No native rendering: Jinja's native mode
#: literal-evaluates strings (`'..''/''..''/x'` becomes `../../x`, `"0x10"` becomes 16); operators get
#: their values through `run_value`/`task_value` instead, as data.
TRAINING_DAG_ARGS: dict[str, Any] = {"render_template_as_native_obj": False, "default_args": DEFAULT_ARGS}
#: Each stage's execution_timeout, by task id (others: DEFAULT_STAGE_TIMEOUT). Generous, several times a slow run
#: on aws-gpu, so only a hung stage meets it: it then fails and its retry or the teardown takes over, instead of
#: holding a slot (or a deferred wait) for ever. Training has none: its Slurm time limit bounds the job.
STAGE_TIMEOUTS = {
    "network": dt.timedelta(minutes=45),
    "dataset": dt.timedelta(hours=6),  # a first upload of a large dataset
    "validate_cluster": dt.timedelta(minutes=45),
    "image": dt.timedelta(hours=3),  # builder, bootstrap, AMI snapshot
    "cluster": dt.timedelta(hours=2),  # ParallelCluster takes 15-40 minutes
    "stage_in": dt.timedelta(hours=6),
    "metrics": dt.timedelta(hours=1),
    "delete_cluster": dt.timedelta(hours=6),  # includes the FSx export of the checkpoints
    "teardown": dt.timedelta(hours=2),
    "janitor": dt.timedelta(hours=1),
}
DEFAULT_STAGE_TIMEOUT = dt.timedelta(minutes=30)
#: Every successful training run emits an event of its stack's own model Asset through this alias, with
#: the model's S3 URI and the metrics summary as extra: `pretrained_encoder(stack)` is what a consumer
#: DAG schedules on, so a demo stack's runs never update a production stack's model.
PRETRAINED_ENCODER = AssetAlias(name="pcflow-pretrained-encoder")


def pretrained_encoder(stack: str) -> Asset:
    """The trained encoder of one stack (the Asset a DAG that uses the model schedules on)."""
    from pcflow.lineage import stack_asset

    return stack_asset(PRETRAINED_ENCODER.name, stack)


VALIDATE_TASK = "validate"
#: Pools that bound spend across all runs of all pcflow DAGs (created from include/pools.json): a cluster
#: task holds a `pcflow_clusters` slot while it creates or adopts its cluster, a train task a `pcflow_trials`
#: slot while its Slurm job (or a sweep's job array) runs, deferred included. Teardowns take no slot.
CLUSTER_POOL = "pcflow_clusters"
TRIAL_POOL = "pcflow_trials"


#: The FSx file system of a cluster that exists before this run (the dry run reports it), else None.
EXISTING_FILE_SYSTEM = Returned("validate_cluster", ("existing", "file_system_ids", 0), optional=True)


def run_value(path: str) -> Returned:
    """One value of the resolved run settings, e.g. `run_value("dataset.bucket")`."""
    return Returned(VALIDATE_TASK, tuple(path.split(".")))


def task_value(task_id: str, key: str) -> Returned:
    """One key of another task's returned dict."""
    return Returned(task_id, (key,))


# -- the trigger form ----------------------------------------------------------------------------


#: The form's fields that change a run setting, by the setting's dotted path. Whether a trigger user
#: may change it is the profile's call (its `overridable` section), like everything in `overrides`.
FORM_FIELDS = {
    "dataset_source": "dataset.source",
    "partition": "dataset.partition",
    "instance_type": "instance_type",
    "capacity_type": "capacity_type",
    "nodes": "training.nodes",
    "gpus_per_node": "training.gpus_per_node",
    "tasks_per_node": "training.tasks_per_node",
    "launcher": "training.launcher",
    "hyperparameters": "training.hyperparameters",
    "teardown_policy": "teardown.policy",
    "early_stopping_patience": "metrics.early_stopping.patience",
    "budget_usd": "budget.usd",
}
#: The form's other fields: which profile, the sweep's trials and grid, and the advanced overrides.
OTHER_FIELDS = ("profile", "trials", "grid", "overrides")


def profile_param() -> Param:
    """Which profile: the deployment's default (`PCFLOW_DEFAULT_PROFILE`), chosen among those that exist.
    Without a default the field starts empty, and a run that leaves it so (a scheduled one too) is
    refused by the first task: no run falls back to a profile nobody chose."""
    choices = profile_names()
    chosen = default_profile()
    schema: dict[str, Any] = {"type": "string", "enum": choices}
    if chosen is None:
        schema = {"type": ["null", "string"], "enum": [None, *choices], "values_display": {"null": "choose one"}}
    return Param(
        chosen,
        **schema,
        title="Profile",
        description=f"Where the run happens and what it may change (the admin's profiles: {', '.join(choices)}).",
        section="Where",
    )


def training_params(*, partition: str | None = None, extra: dict[str, Param] | None = None) -> dict[str, Param]:
    """The trigger form: every field optional except the profile; empty means "as the profile says".
    A field the chosen profile does not list as overridable is refused by the first task when set.
    `extra` (a DAG's own fields) comes after the training fields, before cleanup and overrides."""

    def optional(kind: str, **schema: Any) -> dict[str, Any]:
        return {"type": ["null", kind], **schema}

    def optional_choice(*values: str) -> dict[str, Any]:
        """A select whose empty choice reads as what it means (the UI labels None by the key "null")."""
        return {"type": ["null", "string"], "enum": [None, *values], "values_display": {"null": "as the profile says"}}

    return {
        "profile": profile_param(),
        "dataset_source": Param(
            None,
            **optional("string", maxLength=1024),
            title="Dataset source",
            description="A directory under one of the profile's dataset roots, `s3://bucket/prefix`, or "
            "`builtin:digits`; empty: the profile's.",
            section="Data",
        ),
        "partition": Param(
            partition,
            **optional("string", pattern=PARTITION.pattern),
            title="Data partition",
            description="Folder of this run's data under the dataset prefix; scheduled runs use their date.",
            section="Data",
        ),
        "instance_type": Param(
            None,
            **optional("string", pattern=INSTANCE_TYPE.pattern),
            title="Instance type",
            description="EC2 type of the compute nodes, e.g. g5.12xlarge or p4d.24xlarge.",
            examples=["g5.12xlarge", "g5.48xlarge", "p4d.24xlarge", "p5.48xlarge"],
            section="Resources",
        ),
        "capacity_type": Param(
            None,
            **optional_choice("spot", "ondemand"),
            title="Capacity",
            description="Spot (cheaper, may be interrupted: jobs requeue and resume) or on-demand.",
            section="Resources",
        ),
        "nodes": Param(None, **optional("integer", minimum=1, maximum=512), title="Nodes", section="Resources"),
        "gpus_per_node": Param(
            None, **optional("integer", minimum=0, maximum=16), title="GPUs per node", section="Resources"
        ),
        "tasks_per_node": Param(
            None,
            **optional("integer", minimum=1, maximum=128),
            title="Processes per node",
            description="One per GPU for DDP; on CPU, the number of workers per node.",
            section="Resources",
        ),
        "launcher": Param(
            None,
            **optional_choice("srun", "torchrun", "vissl", "mpirun"),
            title="Launcher",
            section="Training",
        ),
        "hyperparameters": Param(
            {},
            type="object",
            title="Hyperparameters",
            description="Merged over the profile's (epochs, batch_size, lr, temperature, ...). Written to a JSON "
            "file the job reads; never passed through a shell.",
            section="Training",
        ),
        "early_stopping_patience": Param(
            None,
            **optional("integer", minimum=1, maximum=10000),
            title="Early stopping patience",
            description="Stop a trial (scancel, recorded as stopped early, not failed) whose objective has not "
            "improved for this many evaluations, or has become NaN/inf; empty: as the profile says (off).",
            section="Training",
        ),
        **(extra or {}),
        "budget_usd": Param(
            None,
            **optional("number", exclusiveMinimum=0, maximum=1_000_000),
            title="Budget (USD)",
            description="The most this run may cost (compute nodes, head node, FSx). The first task refuses a run "
            "whose maximum (price per hour x time limit x trials) is above it; empty: the profile's budget.",
            section="Cost",
        ),
        "teardown_policy": Param(
            None,
            **optional_choice("always", "never"),
            title="Teardown",
            description="`always`: delete this run's resources when it ends, failed or not; `never`: keep them "
            "(the janitor removes them when their TTL expires).",
            section="Cleanup",
        ),
        "overrides": Param(
            {},
            type="object",
            title="Advanced overrides",
            description="Other settings by their path, deep-merged last, e.g. "
            '{"metrics": {"early_stopping": {"min_delta": 0.01}}}: only those the profile lists as overridable.',
            section="Advanced",
        ),
    }


MAX_TRIALS = 1000


def sweep_params() -> dict[str, Param]:
    """The sweep's own fields: a list of trials, each crossed with every point of a grid."""
    return {
        "trials": Param(
            [{"lr": 0.001}, {"lr": 0.002}, {"lr": 0.004}],
            type="array",
            minItems=1,
            maxItems=MAX_TRIALS,
            items={"type": "object"},
            title="Trials",
            description='One hyperparameter object per trial, e.g. [{"lr": 0.001}, {"lr": 0.01}]; laid over the '
            "profile's hyperparameters.",
            section="Sweep",
        ),
        "grid": Param(
            {},
            type="object",
            additionalProperties={"type": "array", "minItems": 1},
            title="Grid",
            description='Values to try per hyperparameter, e.g. {"lr": [0.001, 0.01], "temperature": [0.1, 0.5]}: '
            "every trial above is crossed with every combination (grid values win), so trials [{}] runs the "
            f"plain grid. At most {MAX_TRIALS} trials in all.",
            section="Sweep",
        ),
    }


def expand_trials(trials: list[dict[str, Any]], grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every trial crossed with every point of the grid, in a stable order (trial-major)."""
    import itertools

    for name, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"grid.{name}: needs a non-empty list of values, got {values!r}")
    points = [dict(zip(grid, combination, strict=True)) for combination in itertools.product(*grid.values())]
    expanded = [{**trial, **point} for trial in trials for point in points]
    if len(expanded) > MAX_TRIALS:
        raise ValueError(
            f"trials: {len(trials)} trials x {len(points)} grid points = {len(expanded)} trials, more than "
            f"{MAX_TRIALS}; split the sweep or shrink the grid"
        )
    return expanded


def overrides_from_params(params: dict[str, Any]) -> dict[str, Any]:
    """The run's Params as a partial run-spec document (empty fields leave the profile's value)."""
    from pcflow.merge import deep_merge

    document: dict[str, Any] = {}
    for param, path in FORM_FIELDS.items():
        value = params.get(param)
        if value is None or (param == "hyperparameters" and not value):
            continue
        *parents, leaf = path.split(".")
        node = document
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return deep_merge(document, params.get("overrides") or {})


def check_conf_fields(params: dict[str, Any]) -> None:
    """Refuse, before anything is merged, what the conf changes beyond what the profile lets a trigger
    user change: unknown fields, settings not listed as overridable, values outside their bounds. A
    sweep's trials and grid change hyperparameters, so they are checked as such."""
    from pcflow.runspec import RunSpecError, check_conf

    unknown = sorted(set(params) - set(FORM_FIELDS) - set(OTHER_FIELDS))
    if unknown:
        fields = ", ".join(sorted([*FORM_FIELDS, *OTHER_FIELDS]))
        raise AirflowFailException(f"{', '.join(unknown)}: not a field of this DAG's form (fields: {fields})")
    grid = params.get("grid") or {}
    swept = [*(params.get("trials") or []), *({k: v} for k, values in grid.items() for v in _listed(values))]
    changes = [overrides_from_params(params), *({"training": {"hyperparameters": trial}} for trial in swept)]
    labels = {path: param for param, path in FORM_FIELDS.items()}
    try:
        check_conf(params.get("profile"), *changes, labels=labels)
    except RunSpecError as exc:
        raise AirflowFailException(str(exc)) from None


def _listed(values: Any) -> list[Any]:
    return values if isinstance(values, list) else [values]


# -- stage functions (run in tasks) --------------------------------------------------------------


def resolve_for_run(
    params: dict[str, Any], context: dict[str, Any], *, dated_partitions: bool = False
) -> dict[str, Any]:
    """The resolved settings plus what the run itself contributes (run key, partition).

    `dated_partitions`: the DAG trains on the partition of its logical date (a scheduled DAG), also
    when one of its runs is started by hand or by a backfill."""
    from pcflow.dataset.partition import resolve_partition
    from pcflow.naming import run_key_from_context
    from pcflow.runspec import RunSpecError, resolve_run_spec

    if not params.get("profile"):
        raise AirflowFailException(
            "profile: none chosen, and the deployment sets no default (the admin sets PCFLOW_DEFAULT_PROFILE)"
        )
    check_conf_fields(params)
    try:
        spec = resolve_run_spec(params["profile"], overrides_from_params(params))
    except RunSpecError as exc:
        raise AirflowFailException(str(exc)) from None
    document = spec.model_dump(mode="json")
    document["training"]["allocation"] = spec.training.allocation()
    # XCom is readable by whoever can see the run: the train task resolves the values itself (RunEnv).
    document["training"]["env"] = sorted(spec.training.env)
    explicit = spec.dataset.partition
    if explicit is None and dated_partitions and context.get("logical_date"):
        explicit = context["logical_date"].strftime("%Y-%m-%d")
    try:
        partition = resolve_partition(context, explicit)
    except ValueError as exc:
        raise AirflowFailException(str(exc)) from None
    document["dataset"]["partition"] = partition
    document["run_key"] = run_key_from_context(context)
    document["objective"] = {"name": spec.metrics.objective, "mode": spec.metrics.mode}
    document["early_stopping"] = early_stopping_rule(spec.metrics)
    if "trials" in params:  # a sweep
        try:
            document["trials"] = expand_trials(params["trials"], params.get("grid") or {})
        except ValueError as exc:
            raise AirflowFailException(str(exc)) from None
    document["keep_resources"] = spec.teardown.policy == "never"
    return document


def run_env(params: dict[str, Any]) -> dict[str, str]:
    """training.env as the first task validated it (same profile, same conf)."""
    from pcflow.runspec import resolve_run_spec

    return resolve_run_spec(params["profile"], overrides_from_params(params)).training.env


class RunEnv:
    """The train task's `env`: resolved from the run's params when the task renders its fields (Airflow
    calls `resolve` on a template field's value), so its values never travel through XCom."""

    def resolve(self, context: Any) -> dict[str, str]:
        return run_env(context["params"])

    def __str__(self) -> str:  # what the UI and the serialized DAG show
        return "<training.env, resolved by the train task>"


def early_stopping_rule(metrics: Any) -> dict[str, Any] | None:
    """The train task's early-stopping rule (its trigger applies it while the job runs), or None."""
    stopping = metrics.early_stopping
    if stopping is None:
        return None
    objective = {"name": stopping.metric or metrics.objective, "mode": stopping.mode or metrics.mode}
    return {"objective": objective, "patience": stopping.patience, "min_delta": stopping.min_delta}


def check_against_aws(run: dict[str, Any], aws_conn_id: str = "aws_default") -> None:
    """What only AWS can answer, asked before anything is created: does the instance type exist here?"""
    from botocore.exceptions import ClientError

    from pcflow.aws.clients import aws_client

    region, instance_type = run["region"], run["instance_type"]
    ec2 = aws_client("ec2", aws_conn_id=aws_conn_id, region_name=region)
    try:
        ec2.describe_instance_types(InstanceTypes=[instance_type])
    except ClientError as exc:
        if exc.response["Error"]["Code"].startswith("InvalidInstanceType"):
            raise AirflowFailException(
                f"instance_type: {instance_type} is not offered in {region}; pick another type or region"
            ) from None
        raise


def planned_cluster(run: dict[str, Any]) -> Any:
    """The ParallelCluster cluster the run will create or adopt (`ClusterSpec`), None for a static one."""
    if run["cluster"]["provider"] != "parallelcluster":
        return None
    from pcflow.cluster.spec import ClusterSpec

    planned = {"head_subnet_id": PLANNED_SUBNET, "compute_subnet_ids": [PLANNED_SUBNET]}
    return ClusterSpec.parse(settings_for_cluster(run, planned, run["ami"]["base_image_id"]))


def check_cluster_settings(run: dict[str, Any], aws_conn_id: str = "aws_default") -> None:
    """ParallelCluster settings checked before the network exists: name, counts, schema of pcflow's
    fields, and a GPU queue on a GPU instance type (EC2 DescribeInstanceTypes)."""
    if run["cluster"]["provider"] != "parallelcluster":
        return
    from pcflow.aws.clients import aws_client
    from pcflow.cluster.spec import ClusterSpecError, check_instance_type

    try:
        spec = planned_cluster(run)
        ec2 = aws_client("ec2", aws_conn_id=aws_conn_id, region_name=run["region"])
        check_instance_type(ec2, spec.instance_type, gpus_required=spec.gpus_required, efa=spec.efa)
    except ClusterSpecError as exc:
        raise AirflowFailException(f"cluster.config: {exc}") from None


def account_preflight(run: dict[str, Any], aws_conn_id: str = "aws_default") -> None:
    """What a first real run trips on (key pair, instance types in the zone, vCPU quota, the builder's
    instance profile, the pcluster CLI and Node.js), asked before anything is created: pcflow/preflight.py."""
    import functools

    from pcflow.aws.clients import aws_client
    from pcflow.preflight import Account, PreflightFailed, run_preflight

    @functools.cache
    def client(service: str) -> Any:
        return aws_client(service, aws_conn_id=aws_conn_id, region_name=run["region"])

    try:
        run_preflight(Account(run, planned_cluster(run), client), skip=run["preflight"]["skip"])
    except PreflightFailed as exc:
        raise AirflowFailException(str(exc)) from None


@task(task_id=VALIDATE_TASK, multiple_outputs=False)
def validate_run(
    dated_partitions: bool = False, params: dict[str, Any] | None = None, **context: Any
) -> dict[str, Any]:
    """Refuse bad settings before anything costs money; the resolved document is kept with the run.
    The checks run in order, those that ask nothing of AWS first; each names the field it refuses."""
    from pcflow.checks import check_cost, check_dataset_source, check_job, check_network, check_static_cluster

    document = resolve_for_run(params or {}, context, dated_partitions=dated_partitions)
    check_job(document, env=run_env(params or {}))  # env values stay out of the document (XCom)
    checks = (
        check_network,
        check_static_cluster,
        check_cluster_settings,
        check_dataset_source,
        check_against_aws,
        account_preflight,
    )
    for check in checks:
        check(document)
    document["cost"] = check_cost(document)  # the price and maximum; refused above the budget
    return document


@task(multiple_outputs=False)
def ensure_dataset_bucket(run: dict[str, Any]) -> dict[str, Any]:
    """The dataset/report bucket stacks share: created with pcflow's settings (versioned, so a manifest
    names the exact bytes it lists while a later load replaces keys), or adopted as it is; never
    re-tagged, and this stack recorded as one of its users (`pcflow.aws.buckets`)."""
    from pcflow.aws.clients import aws_client
    from pcflow.aws.storage import ABORT_INCOMPLETE_UPLOADS, EXPIRE_REPLACED_VERSIONS, ensure_shared_bucket

    s3 = aws_client("s3", aws_conn_id="aws_default", region_name=run["region"])
    rules = [ABORT_INCOMPLETE_UPLOADS, EXPIRE_REPLACED_VERSIONS]
    return ensure_shared_bucket(
        s3, run["dataset"]["bucket"], region=run["region"], stack=run["stack"], versioning=True, lifecycle_rules=rules
    )


@task
def dataset_source(run: dict[str, Any]) -> str:
    """Where the loader reads from: `builtin:digits` becomes the digits as PNG class folders."""
    source = run["dataset"]["source"]
    if source != "builtin:digits":
        return source
    import os
    from pathlib import Path

    from pcflow.dataset.digits import materialize_digits

    cache = Path(os.environ.get("PCFLOW_CACHE_DIR", Path.home() / ".cache" / "pcflow")) / "digits"
    return str(materialize_digits(cache))


#: Stands for the subnets the network task will make, in the checks the first task runs on the
#: ParallelCluster settings (ParallelCluster itself resolves subnets, so its dry run waits for them).
PLANNED_SUBNET = "subnet-00000000"


def settings_for_cluster(run: dict[str, Any], network: dict[str, Any], image_id: str | None) -> dict[str, Any]:
    """The provider's settings: the profile's, plus the network's subnets and the image to boot."""
    settings = dict(run["cluster"]["config"])
    if run["cluster"]["provider"] != "parallelcluster":
        return settings
    from pcflow.naming import resource_name

    training = run["training"]
    return {
        "name": resource_name(run["stack"], "cluster", max_len=40),
        "region": run["region"],
        "custom_ami": image_id,
        "head_subnet_id": network["head_subnet_id"],
        "compute_subnet_ids": network["compute_subnet_ids"],
        "instance_type": run["instance_type"],
        "capacity_type": "SPOT" if run["capacity_type"] == "spot" else "ONDEMAND",
        "max_count": settings.pop("max_count", training["nodes"]),  # below the job's nodes: refused
        "job_nodes": training["nodes"],
        "gpus_required": training["gpus_per_node"] > 0,
        "s3_bucket": run["dataset"]["bucket"],
        "s3_prefix": run["dataset"]["prefix"],
        **settings,
    }


def planned_image_id(run: dict[str, Any], aws_conn_id: str = "aws_default") -> str | None:
    """The image a dry run checks the config against before anything is baked: the bake's base image
    (the baked image derives from it: same OS, same ParallelCluster version, so the same validators)."""
    ami = run["ami"]
    if not ami["enabled"] or ami["base_image_id"]:
        return ami["base_image_id"]
    from pcflow.aws.ami import find_base_image
    from pcflow.aws.clients import aws_client

    ec2 = aws_client("ec2", aws_conn_id=aws_conn_id, region_name=run["region"])
    try:
        return find_base_image(
            ec2, region=run["region"], pcluster_version=ami["pcluster_version"], os=ami["os"],
            owners=ami["base_image_owners"],
        )  # fmt: skip
    except ValueError as exc:
        raise AirflowFailException(f"ami: {exc}") from None


@task(multiple_outputs=False)
def cluster_settings(
    run: dict[str, Any], network: dict[str, Any], image: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The settings the cluster is made with; without `image` (the dry run, before the bake), the
    settings with the image the bake will start from."""
    image_id = (image or {}).get("image_id") if image is not None else planned_image_id(run)
    return settings_for_cluster(run, network, image_id)


def cluster_hook(cluster: dict[str, Any]):
    from pcflow.slurm.hook import SlurmHook

    head = cluster.get("head_node") or {}
    return SlurmHook(cluster["ssh_conn_id"], remote_host=head.get("address"), host_key=head.get("host_key"))


@task
def stage_in(run: dict[str, Any], cluster: dict[str, Any], dataset: dict[str, Any]) -> str:
    """The partition where the cluster's jobs read it (copied for a static cluster; FSx does it on AWS)."""
    import logging

    from pcflow.aws.clients import aws_client
    from pcflow.dataset.stage_in import copy_partition, data_dir_on_cluster

    data_dir = data_dir_on_cluster(run, cluster, dataset)
    if cluster["provider"] == "static":
        hook = cluster_hook(cluster)
        s3 = aws_client("s3", aws_conn_id="aws_default", region_name=run["region"])
        log = logging.getLogger("airflow.task")
        copy_partition(s3, hook, bucket=dataset["bucket"], root=dataset["root"], dest=data_dir, log=log)
        hook.close()
    return data_dir


@task(multiple_outputs=True)
def ship_payload(run: dict[str, Any], cluster: dict[str, Any]) -> dict[str, Any]:
    """The run's code on the cluster: the profile's payload, shipped by content hash (reused when there)."""
    if not run["training"]["payload"]:
        return {"name": None, "digest": None, "dir": None, "reused": False}
    import logging

    from pcflow.slurm.payload import build_archive, ship

    hook = cluster_hook(cluster)
    try:
        archive = build_archive(run["training"]["payload"])
        root = cluster.get("shared_root") or hook.shared_root
        return ship(hook, archive, shared_root=root, log=logging.getLogger("airflow.task"))
    finally:
        hook.close()


@task(multiple_outputs=True)
def training_inputs(
    run: dict[str, Any], cluster: dict[str, Any], data_dir: str, trials: list[dict] | None = None
) -> dict[str, Any]:
    """Where and how to reach the cluster, and the data's path there, for the train task."""
    head = cluster.get("head_node") or {}
    hyperparameters = {**run["training"]["hyperparameters"], "data_dir": data_dir}
    return {
        "ssh_conn_id": cluster["ssh_conn_id"],
        "remote_host": head.get("address"),
        "host_key": head.get("host_key"),
        "shared_root": cluster.get("shared_root"),
        "hyperparameters": hyperparameters,
        "trials": [{**hyperparameters, **trial} for trial in (trials or [])],
    }


def build_training_pipeline(
    *, run_scoped: bool = True, sweep: bool = False, dated_partitions: bool = False
) -> dict[str, Any]:
    """Declare the stages in the DAG being defined; returns its tasks by name.

    validate -> approve_cost (skipped below the profile's cost threshold) -> (network, bucket -> dataset)
    -> image -> cluster -> (stage_in, ship_payload) -> train, with the cluster and (for run-scoped
    infrastructure) the network as setups whose teardowns run even when training fails. `run_scoped=False`
    (nightly) keeps the network and cluster for the next run instead: no teardown, and every run stamps
    their `pcflow:expires` again (`teardown.keep_hours` ahead), so the next night adopts them and the
    janitor reaps them once the nights stop. The image is the stack's in both cases: reused by recipe, its
    expiry stamped again by every run that uses it.
    """
    from pcflow.approval import AFTER_APPROVAL, CostApprovalOperator
    from pcflow.aws.ami import BakeImageOperator
    from pcflow.aws.network import EnsureNetworkOperator
    from pcflow.aws.teardown import TeardownOperator
    from pcflow.cluster.operators import DeleteClusterOperator, EnsureClusterOperator, ValidateClusterConfigOperator
    from pcflow.dataset.operators import DatasetLoadOperator
    from pcflow.metrics.operators import HarvestMetricsOperator, SweepLeaderboardOperator
    from pcflow.slurm.operators import SlurmArrayJobOperator, SlurmJobOperator

    keep_hours = run_value("teardown.keep_hours")
    ttl_hours = run_value("ttl_hours") if run_scoped else keep_hours
    run = validate_run(dated_partitions)
    # Above the profile's threshold a person approves the cost first; below it, this task is skipped.
    approval = CostApprovalOperator(task_id="approve_cost", cost=run_value("cost"))
    network = EnsureNetworkOperator(
        task_id="network",
        stack=run_value("stack"),
        network=run_value("network"),
        run_scoped=run_scoped,
        ttl_hours=ttl_hours,
        trigger_rule=AFTER_APPROVAL,
    )
    bucket = ensure_dataset_bucket.override(trigger_rule=AFTER_APPROVAL)(run)
    source = dataset_source.override(trigger_rule=AFTER_APPROVAL)(run)
    approval >> [network, bucket, source]
    dataset = DatasetLoadOperator(
        task_id="dataset",
        source=source,
        bucket=run_value("dataset.bucket"),
        prefix=run_value("dataset.prefix"),
        stack=run_value("stack"),
        partition=run_value("dataset.partition"),
        mode=run_value("dataset.mode"),
        # A cluster kept from an earlier run already has its file system: import the new partition.
        fsx_file_system_id=EXISTING_FILE_SYSTEM,
        outlets=[DATASET],  # new content in the partition: an event of the stack's dataset (pcflow.lineage)
    )
    bucket >> dataset
    image = BakeImageOperator(
        task_id="image",
        stack=run_value("stack"),
        pcluster_version=run_value("ami.pcluster_version"),
        bootstrap_script_path=run_value("ami.bootstrap_script"),
        instance_profile=run_value("ami.instance_profile"),
        subnet_id=task_value("network", "head_subnet_id"),
        security_group_ids=[task_value("network", "cluster_security_group_id")],
        instance_type=run_value("ami.instance_type"),
        base_image_id=run_value("ami.base_image_id"),
        base_image_owners=run_value("ami.base_image_owners"),
        os=run_value("ami.os"),
        wait_for_ssm_agent=run_value("ami.wait_for_ssm_agent"),
        enabled=run_value("ami.enabled"),
        environment_file=run_value("ami.environment"),
        ttl_hours=keep_hours,
    )
    cluster_args = {
        "provider": run_value("cluster.provider"),
        "stack": run_value("stack"),
        "ssh_conn_id": run_value("cluster.ssh_conn_id"),
        "suppress_validators": run_value("cluster.suppress_validators"),
        "config_bucket": run_value("dataset.bucket"),
    }
    # Validate before spend: ParallelCluster's dry run needs real subnets (it resolves them while loading
    # the config), so it runs once the network (free) exists, before the bake, the data or the cluster.
    dry_run = ValidateClusterConfigOperator(
        task_id="validate_cluster",
        cluster=cluster_settings.override(task_id="dry_run_settings")(run, network.output),
        run_scoped=run_scoped,
        ttl_hours=ttl_hours,
        **cluster_args,
    )
    bucket >> dry_run >> [dataset, image]
    settings = cluster_settings(run, network.output, image.output)
    cluster = EnsureClusterOperator(
        task_id="cluster",
        cluster=settings,
        run_scoped=run_scoped,
        ttl_hours=ttl_hours,
        pool=CLUSTER_POOL,
        **cluster_args,
    )
    # The cluster is made once its data is in S3: a file system linked at creation lists the whole
    # partition (FSx imports the linked prefix's listing then), and a failed load makes no cluster.
    dataset >> cluster
    data_dir = stage_in(run, cluster.output, dataset.output)
    payload = ship_payload(run, cluster.output)
    trials = run_value("trials") if sweep else None
    inputs = training_inputs(run, cluster.output, data_dir, trials)
    job = {
        "program": run_value("training.program"),
        "launcher": run_value("training.launcher"),
        "python": run_value("training.python"),
        "allocation": run_value("training.allocation"),
        "env": RunEnv(),
        "ssh_conn_id": inputs["ssh_conn_id"],
        "remote_host": inputs["remote_host"],
        "host_key": inputs["host_key"],
        "shared_root": inputs["shared_root"],
        "max_restarts": run_value("training.max_restarts"),
        "early_stopping": run_value("early_stopping"),
        "pending_timeout": run_value("training.pending_timeout_s"),
        "payload_dir": payload["dir"],
        "budget": run_value("cost"),  # the wait logs the cost so far and stops the job at the budget
        "inlets": [DATASET],  # what it trains on; the model's event names the partition (pcflow.lineage)
    }
    if sweep:
        train = SlurmArrayJobOperator(
            task_id="train", trials=inputs["trials"], min_success_ratio=0.5, retries=0, pool=TRIAL_POOL, **job
        )
    else:
        train = SlurmJobOperator(
            task_id="train", hyperparameters=inputs["hyperparameters"], retries=0, pool=TRIAL_POOL, **job
        )
    inputs >> train
    harvest = SweepLeaderboardOperator if sweep else HarvestMetricsOperator
    metrics = harvest(
        task_id="metrics",
        job=train.output,
        bucket=run_value("dataset.bucket"),
        stack=run_value("stack"),
        objective=run_value("objective"),
        instance_type=run_value("instance_type"),
        capacity_type=run_value("capacity_type"),
        nodes=run_value("training.nodes"),
        metric_definitions=run_value("metrics.metric_definitions"),
        cluster_provider=run_value("cluster.provider"),
        cluster=settings,  # ParallelCluster's head node and FSx are priced from these
        cost_before=run_value("cost"),
        region_name=run_value("region"),  # priced with the run's region's prices
        cloudwatch=run_value("metrics.publish_cloudwatch"),
        ssh_conn_id=inputs["ssh_conn_id"],
        remote_host=inputs["remote_host"],
        host_key=inputs["host_key"],
        dataset=dataset.output,
        inlets=[DATASET],
        outlets=[PRETRAINED_ENCODER],
    )

    tasks = {"validate": run, "approve_cost": approval, "network": network, "validate_cluster": dry_run}
    tasks |= {"dataset": dataset, "image": image, "cluster": cluster, "train": train, "metrics": metrics}
    if run_scoped:
        delete_cluster = DeleteClusterOperator(
            task_id="delete_cluster",
            cluster=settings,
            cluster_name=task_value("cluster", "name"),
            export_fsx=run_value("teardown.export_fsx"),
            keep=run_value("keep_resources"),
            run_scoped=True,  # deletes only a cluster tagged with this stack and run
            **cluster_args,
        )
        metrics >> delete_cluster.as_teardown(setups=cluster)
        tasks["delete_cluster"] = delete_cluster
        teardown = TeardownOperator(
            task_id="teardown",
            stack=run_value("stack"),
            run=run_value("run_key"),
            handler_sets=("pcluster", "ec2", "fsx"),
            dry_run=run_value("keep_resources"),
        )
        delete_cluster >> teardown.as_teardown(setups=network)
        tasks["teardown"] = teardown
    # Operators read the resolved settings through templates: they must run after validate.
    run >> [task for name, task in tasks.items() if name != "validate"]
    for stage in train.dag.tasks:
        if stage is not train:
            stage.execution_timeout = STAGE_TIMEOUTS.get(stage.task_id, DEFAULT_STAGE_TIMEOUT)
    return tasks
