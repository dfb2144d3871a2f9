"""The run's settings: the form's Params mapped onto the run spec, resolved and checked by the first task,
then handed to every later stage as data.

Operators receive the validated document's values through `RUN`, e.g. `RUN.dataset.bucket`: picked in
Python when the operator renders its fields, never rendered again by Jinja, so a value reaches its stage
exactly as validated. Each path is checked against the document's declared fields when the DAG is built
(a typo fails the DAG file's parse, naming the fields there are), and recorded in `RUN_VALUE_PATHS`, which
a test checks against the document the first task returns for every profile.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from pcflow.errors import deployment_admin, refused, trigger_user
from pcflow.pipeline.form import FORM_FIELDS, MAX_TRIALS, OTHER_FIELDS
from pcflow.values import Returned

if TYPE_CHECKING:  # pydantic models: DAG files import this module when they are parsed
    from pcflow.capacity import CapacitySettings, PlannedOption
    from pcflow.resolved import PlannedRun
    from pcflow.runspec import RunSpec

VALIDATE_TASK = "validate"
#: Every `RUN` path the pipeline's tasks read, dotted (filled as the pipeline is declared).
RUN_VALUE_PATHS: set[str] = set()
#: Stands for the subnets the network task will make, in the checks the first task runs on the
#: ParallelCluster settings (ParallelCluster itself resolves subnets, so its dry run waits for them).
PLANNED_SUBNET = "subnet-00000000"
#: The same for the head security group the network task will make.
PLANNED_SECURITY_GROUP = "sg-00000000"


class RunSection(Returned):
    """A section of the first task's document (`RUN`: the whole of it), whose attributes are its fields: a
    sub-model's a `RunSection` again, any other a `Returned`. Either is a value an operator argument can
    take, resolved from the document when the operator renders its fields.

    The fields are those the document declares (`resolved.ResolvedRun`, through its field tree
    `run_fields.FIELDS`: DAG files must not import the models), so a misspelt or renamed field raises
    AttributeError, naming the section's fields, when the DAG file is parsed, not KeyError mid-run."""

    def __getattr__(self, name: str) -> Returned:
        if name.startswith("_"):  # copy, pickle and hasattr probe for such names: never a field
            raise AttributeError(name)
        fields = section_fields(self.path)
        if name not in fields:
            where = ".".join(map(str, self.path)) or "the run document"
            raise AttributeError(f"{where} has no field {name!r}; its fields: {', '.join(fields)}")
        path = (*self.path, name)
        RUN_VALUE_PATHS.add(".".join(map(str, path)))
        return (Returned if fields[name] is None else RunSection)(self.task_id, path)

    def __dir__(self) -> list[str]:
        return [*super().__dir__(), *section_fields(self.path)]


def section_fields(path: tuple[str | int, ...]) -> dict[str, Any]:
    """The declared fields of the document's section at `path` (a sub-model's tree, None for a value). Read
    when a DAG is built, not when this module is imported: `python -m pcflow.pipeline.resolved` writes them
    again even where they no longer load."""
    from pcflow.pipeline.run_fields import FIELDS

    tree = FIELDS
    for step in path:
        tree = tree[step]
    return tree


#: The first task's document, read by attribute: `RUN.dataset.bucket`, `RUN.cost`, `RUN.expiry.run_hours`.
RUN = RunSection(VALIDATE_TASK)


def task_value(task_id: str, key: str) -> Returned:
    """One key of another task's returned dict."""
    return Returned(task_id, (key,))


#: The FSx file system of a cluster that exists before this run (the dry run reports it), else None.
EXISTING_FILE_SYSTEM = Returned("validate_cluster", ("existing", "file_system_ids", 0), optional=True)


def expand_trials(trials: list[dict[str, Any]], grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every trial crossed with every point of the grid, in a stable order (trial-major)."""
    swept = sweep_points(trials, grid)
    if len(swept) > MAX_TRIALS:
        problem = (
            f"{len(trials)} trials x {len(swept) // max(len(trials), 1)} grid points = {len(swept)} trials, more "
            f"than {MAX_TRIALS}; split the sweep or shrink the grid"
        )
        raise refused("trials", problem, trigger_user())
    return [{**trial, **point} for _, trial, point in swept]


def sweep_points(trials: list[dict[str, Any]], grid: dict[str, list[Any]]) -> list[tuple[int, dict, dict]]:
    """(the trial's index in `trials`, the trial, the grid point) for each trial of the sweep, trial-major:
    where each of its values came from, for a refusal to name."""
    for name, values in grid.items():
        if not isinstance(values, list) or not values:
            raise refused(f"grid.{name}", f"needs a non-empty list of values, got {values!r}", trigger_user())
    points = [dict(zip(grid, combination, strict=True)) for combination in itertools.product(*grid.values())]
    return [(index, trial, point) for index, trial in enumerate(trials) for point in points]


def hyperparameter_cases(run: PlannedRun, params: dict[str, Any]) -> list[Any]:
    """The hyperparameter objects the job would receive (pcflow.code.hparams.Case): the run's, or each of
    a sweep's trials over them, each value labelled with the setting it came from."""
    from pcflow.code.hparams import Case

    base = run.training.hyperparameters
    if "trials" not in params:
        return [Case(base)]
    cases = []
    for index, trial, point in sweep_points(params["trials"], params.get("grid") or {}):
        origin = {**{name: f"trials[{index}].{name}" for name in trial}, **{name: f"grid.{name}" for name in point}}
        cases.append(Case({**base, **trial, **point}, origin, whole=f"trials[{index}]"))
    return cases


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
    from pcflow.runspec import check_conf
    from pcflow.trust import ConfRefused

    unknown = sorted(set(params) - set(FORM_FIELDS) - set(OTHER_FIELDS))
    if unknown:
        fields = ", ".join(sorted([*FORM_FIELDS, *OTHER_FIELDS]))
        raise ConfRefused(f"{', '.join(unknown)}: not a field of this DAG's form (fields: {fields})")
    grid = params.get("grid") or {}
    swept = [*(params.get("trials") or []), *({k: v} for k, values in grid.items() for v in _listed(values))]
    changes = [overrides_from_params(params), *({"training": {"hyperparameters": trial}} for trial in swept)]
    labels = {path: param for param, path in FORM_FIELDS.items()}
    check_conf(params.get("profile"), *changes, labels=labels)


def _listed(values: Any) -> list[Any]:
    return values if isinstance(values, list) else [values]


def resolve_for_run(
    params: dict[str, Any], context: dict[str, Any], *, dated_partitions: bool = False, nightly: bool = False
) -> PlannedRun:
    """The resolved settings plus what the run itself contributes (run key, partition).

    `dated_partitions`: the DAG trains on the partition of its logical date (a scheduled DAG), also
    when one of its runs is started by hand or by a backfill. `nightly`: the profile's `nightly.warm_start`
    (`latest`: continue from the last successful night) unless the conf names a `training.warm_start`."""
    from pcflow.naming import run_key_from_context
    from pcflow.paths import check_offered
    from pcflow.runspec import resolve_run_spec

    if not params.get("profile"):
        problem = "none chosen, and the deployment sets no default (the admin sets PCFLOW_DEFAULT_PROFILE)"
        raise refused("profile", problem, deployment_admin())
    check_offered(params["profile"])  # the form's choices were fixed when the DAG was parsed, maybe elsewhere
    check_conf_fields(params)
    spec = resolve_run_spec(params["profile"], overrides_from_params(params))
    if nightly and spec.training.warm_start is None:  # the admin's: no conf change to check
        spec = spec.model_copy(
            update={"training": spec.training.model_copy(update={"warm_start": spec.nightly.warm_start})}
        )
    trials = expand_trials(params["trials"], params.get("grid") or {}) if "trials" in params else None  # a sweep
    return plan_run(
        spec,
        run_key=run_key_from_context(context),
        partition=run_partition(spec, context, dated_partitions),
        trials=trials,
    )


def plan_run(spec: RunSpec, *, run_key: str, partition: str, trials: list[dict[str, Any]] | None = None) -> PlannedRun:
    """The run spec with what the run derives from it: the Slurm allocation, the capacity options, the
    environment by name only (XCom is readable by whoever can see the run: the train task resolves the
    values itself, RunEnv), the objective and early-stopping rule, the trials at once and the expiry."""
    from pcflow.lifetime import expiry_hours
    from pcflow.resolved import PlannedRun
    from pcflow.runspec import RESOLVED

    document = spec.model_dump(mode="json")
    document["training"] |= {
        "allocation": spec.training.allocation(),
        "env": sorted(spec.training.env),
        "secrets": spec.training.secret_references(),
    }
    document["dataset"]["partition"] = partition
    trial_count = len(trials or []) or 1
    document["sweep"]["parallel"] = trials_at_once(spec, len(trials or []))
    return PlannedRun.model_validate(
        {
            **document,
            "run_key": run_key,
            "objective": {"name": spec.metrics.objective, "mode": spec.metrics.mode},
            "early_stopping": early_stopping_rule(spec.metrics),
            **({"trials": trials} if trials is not None else {}),
            "keep_resources": spec.teardown.policy == "never",
            "expiry": expiry_hours(spec, trial_count),  # the stamps outlast the run's longest possible time
            "capacity_order": run_capacity_order(spec),  # the options a pending job falls back through
        },
        context={RESOLVED: True},  # the spec's paths are resolved already
    )


def run_capacity_order(spec: RunSpec) -> list[PlannedOption]:
    """The run's capacity options in order (pcflow.capacity), each with its Slurm partition: ParallelCluster's
    queue (cluster.config.queue_name, its fallbacks `<queue>-2`...), a static cluster's job partition."""
    from pcflow.capacity import capacity_order
    from pcflow.cluster.spec import ClusterSpec

    config = spec.cluster.config
    if spec.cluster.provider == "parallelcluster":
        first = config.get("queue_name") or ClusterSpec.model_fields["queue_name"].default
    else:
        first = spec.training.partition or config.get("partition")
    try:
        return capacity_order(
            spec.capacity,
            instance_type=spec.instance_type,
            capacity_type=spec.capacity_type,
            provider=spec.cluster.provider,
            first_partition=first,
            zones=spec.network.zone_subnet_cidrs,
        )
    except ValueError as exc:
        raise refused("capacity", str(exc), deployment_admin()) from None


def cluster_capacity(capacity: CapacitySettings) -> dict[str, Any]:
    """The ClusterSpec fields of the run's `capacity` section: the first queue's more instance types, strategy
    and reservation, and the fallback options (each its own queue; ParallelCluster names their partitions)."""
    fallback = [option.model_dump(mode="json", exclude={"partition"}) for option in capacity.fallback]
    found = {
        "instance_types": capacity.instance_types,
        "allocation_strategy": capacity.allocation_strategy,
        "capacity_reservation_id": capacity.capacity_reservation_id,
        "fallback": fallback,
    }
    return {k: v for k, v in found.items() if v}


def zone_subnets(network: dict[str, Any]) -> dict[str, Any]:
    """The ClusterSpec field of the network's other zones' compute subnets (zone -> id), where it has any."""
    zones = network.get("zone_subnet_ids") or {}
    return {"zone_subnet_ids": dict(zones)} if zones else {}


def trials_at_once(spec: RunSpec, trials: int) -> int:
    """How many of the run's `trials` run at once (1 for a run that is no sweep): the profile's (or conf's)
    `sweep.max_parallel`, no more than there are trials, and on ParallelCluster no more than an admin's
    `cluster.config.max_count` holds (`training.nodes` each). The array's `%` throttle, the queue's MaxCount
    (`settings_for_cluster`) and the cost's waves of trials (pcflow.budget) all read this one number."""
    if not trials:
        return 1
    parallel = min(spec.sweep.max_parallel, trials)
    cap = spec.cluster.config.get("max_count") if spec.cluster.provider == "parallelcluster" else None
    if isinstance(cap, int) and not isinstance(cap, bool):
        parallel = min(parallel, max(1, cap // spec.training.nodes))
    return parallel


def run_partition(spec: Any, context: dict[str, Any], dated_partitions: bool) -> str:
    """The data partition: the conf's or profile's, else (a scheduled DAG) the logical date's."""
    from pcflow.dataset.partition import resolve_partition

    explicit = spec.dataset.partition
    if explicit is None and dated_partitions and context.get("logical_date"):
        explicit = context["logical_date"].strftime("%Y-%m-%d")
    return resolve_partition(context, explicit)


def run_env(params: dict[str, Any]) -> dict[str, str]:
    """training.env as the first task validated it (same profile, same conf), its secrets read."""
    from pcflow.runspec import resolve_run_spec

    return resolve_run_spec(params["profile"], overrides_from_params(params)).training.env_values()


class RunEnv:
    """The train task's `env`: resolved from the run's params when the task renders its fields (Airflow
    calls `resolve` on a template field's value), so its values never travel through XCom."""

    def resolve(self, context: Any) -> dict[str, str]:
        """The environment, read from the run's params at render time (Airflow calls this for a template field's
        value)."""
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


def cluster_name(stack: str, run_key: str | None = None) -> str:
    """The ParallelCluster name: the stack's (`pcflow-<stack>-cluster`, kept across nightly runs), or one run's
    own (with its key, so a retry of the run adopts it and runs of a stack never collide). At most 40
    characters, Slurm accounting's limit (ParallelCluster's own is 60), shortened with a digest of the key."""
    from pcflow.cluster.spec import CLUSTER_NAME_MAX_ACCOUNTING
    from pcflow.naming import resource_name

    parts = [run_key] if run_key else []
    return resource_name(stack, "cluster", *parts, max_len=CLUSTER_NAME_MAX_ACCOUNTING)


#: What the network section decides for the cluster: never set in `cluster.config`.
FROM_NETWORK = ("ssh_allowed_ips", "allow_ssh_from_anywhere", "head_security_group_ids")
#: What the cluster section itself says (`cluster.job_user`, `cluster.job_accounts`): not again in `cluster.config`.
FROM_CLUSTER_SECTION = ("job_user", "job_accounts")


def settings_for_cluster(
    run: PlannedRun, network: dict[str, Any], image_id: str | None, *, own: bool = False
) -> dict[str, Any]:
    """The provider's settings: the profile's, plus the network's subnets and head security group, who
    may SSH to the head node (`network.ssh_ingress_cidrs`, aws/ssh_ingress.py) and the image to boot.
    The cluster is the stack's (`own=False`: the nightly keeps it) or the run's own (`cluster_name`)."""
    settings = dict(run.cluster.config)
    if run.cluster.provider != "parallelcluster":
        return settings
    check_cluster_config(settings)
    from pcflow.aws.ssh_ingress import head_node_allowed_ips
    from pcflow.cluster.spec import ClusterSpecError

    try:
        allowed_ips = head_node_allowed_ips(run.network.ssh_ingress_cidrs)
    except ValueError as exc:
        raise ClusterSpecError(str(exc)) from None
    training = run.training
    return {
        "ssh_allowed_ips": allowed_ips,
        "allow_ssh_from_anywhere": run.network.allow_ssh_from_anywhere,
        "head_security_group_ids": [network["head_security_group_id"]],
        "name": cluster_name(run.stack, run.run_key if own else None),
        "region": run.region,
        "custom_ami": image_id,
        "head_subnet_id": network["head_subnet_id"],
        "compute_subnet_ids": network["compute_subnet_ids"],
        **zone_subnets(network),  # the other zones' compute subnets, for the fallbacks that name a zone
        "instance_type": run.instance_type,
        "capacity_type": "SPOT" if run.capacity_type == "spot" else "ONDEMAND",
        # Room for the trials that run at once (a sweep), each on nodes of its own; the admin's max_count
        # wins (trials_at_once stays within it); below the job's nodes: refused.
        "max_count": settings.pop("max_count", training.nodes * run.sweep.parallel),
        "job_nodes": training.nodes,
        "gpus_required": training.gpus_per_node > 0,
        "s3_bucket": run.dataset.bucket,
        "s3_prefix": run.dataset.prefix,
        "job_user": run.cluster.job_user,  # every node makes it (cluster/node_setup.py)
        "job_accounts": run.cluster.job_accounts,  # and the rest of the pool
        **cluster_capacity(run.capacity),  # more instance types, the fallback queues (pcflow.capacity)
        **settings,
    }


def check_cluster_config(settings: dict[str, Any]) -> None:
    """Refuse in `cluster.config` what the network and cluster sections decide (FROM_NETWORK,
    FROM_CLUSTER_SECTION): one place says each setting."""
    from pcflow.cluster.spec import ClusterSpecError

    owned = sorted(set(FROM_NETWORK) & set(settings))
    if owned:
        raise ClusterSpecError(
            f"{', '.join(owned)}: set from the network section (network.ssh_ingress_cidrs, "
            "network.allow_ssh_from_anywhere), not in cluster.config"
        )
    clash = sorted(set(FROM_CLUSTER_SECTION) & set(settings))
    if clash:
        raise ClusterSpecError(
            f"{clash[0]}: set as cluster.{clash[0]} (the accounts jobs run as), not in cluster.config"
        )
