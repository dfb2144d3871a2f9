"""What the first task checks beyond the settings' own schema, with the validators the stages use later
(not copies), so nothing the first task accepts is refused later for its form and no paid resource is
created for a run whose job cannot be submitted or whose data cannot load.

Each check takes the planned run (`pcflow.resolved.PlannedRun`) and raises a `PcflowInputError` (errors.py: not retried)
naming the field and who may change it (`setting_owner`: the profile's `overridable` decides).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pcflow.aws.clients import DEFAULT_AWS_CONN_ID
from pcflow.datasource import SourceRefused, parse_source
from pcflow.errors import ConfigurationError, PcflowInputError, refusal, refused, trigger_user

if TYPE_CHECKING:
    from pcflow.budget import Estimate
    from pcflow.resolved import PlannedRun


def setting_owner(run: PlannedRun, path: str) -> str:
    """Who may change the run's setting at `path`, in errors.py's words: the profile's `overridable` decides."""
    from pcflow.runspec import profile_rules  # pydantic: imported when a run is checked, not when a DAG parses
    from pcflow.trust import owner_of

    return owner_of(path, profile_rules(run.profile), run.profile)


def refused_setting(run: PlannedRun, path: str, problem: str, kind: type[PcflowInputError] | None = None):
    """`errors.refused` for a setting of this run, its owner decided by the run's profile."""
    return refused(path, problem, setting_owner(run, path), kind)


def check_code(run: PlannedRun) -> PlannedRun:
    """The run's own code pinned before anything is spent: a git ref resolved to the commit every later
    task fetches (the run returned records it), a directory that exists (pcflow.code.deliver.pin_code)."""
    from pcflow.code.deliver import pin_code

    code = pin_code(run.training.code, lambda path: setting_owner(run, path))
    return run.model_copy(update={"training": run.training.model_copy(update={"code": code})})


#: Refused hyperparameters a message lists at most (a sweep of 1000 trials may refuse each).
SHOWN = 20


def check_hyperparameters(run: PlannedRun, cases: list[Any], aws_conn_id: str = DEFAULT_AWS_CONN_ID) -> None:
    """Every hyperparameter object the job would receive (`cases`: pcflow.code.hparams.Case, one per
    trial) checked against the schema the run's code declares (pcflow.code.hparams), before spend: each
    refused value named by the setting it came from. A code without a schema is not checked; a schema
    that is not one, or a file `training.hparams_schema` names that the code lacks, is refused."""
    import functools

    from pcflow.aws.clients import aws_client
    from pcflow.bundles import BundleRefused
    from pcflow.code.hparams import code_schema, parse_schema, problems
    from pcflow.code.schema_file import SchemaRefused
    from pcflow.runspec import DATA_DIR

    source = "training.code" if run.training.code else "training.payload"
    s3 = functools.cache(lambda: aws_client("s3", aws_conn_id=aws_conn_id, region_name=run.region))
    try:
        where, data = code_schema(run, s3)
        if data is None and run.training.hparams_schema:
            raise refused_setting(run, "training.hparams_schema", f"{where}: no such file in the code")
        if data is None:
            return
        found = problems(parse_schema(data, where), cases, data_dir=DATA_DIR, where=where)
    except (SchemaRefused, BundleRefused) as exc:
        problem = f"{exc}; the schema is the project's: its author fixes it"
        raise refused(source, problem, setting_owner(run, source), SchemaRefused) from None
    if found:
        lines = [refusal(path, problem, _hyperparameter_owner(run, path)) for path, problem in found[:SHOWN]]
        more = [f"and {len(found) - SHOWN} more"] if len(found) > SHOWN else []
        raise ConfigurationError(f"hyperparameters {where} refuses:\n  " + "\n  ".join([*lines, *more]))


def _hyperparameter_owner(run: PlannedRun, path: str) -> str:
    """A sweep's trials and grid are the trigger user's; the rest the profile's `overridable` decides."""
    return trigger_user(run.profile) if path.startswith(("trials[", "grid.")) else setting_owner(run, path)


def check_job(run: PlannedRun, env: dict[str, str]) -> None:
    """The Slurm job as the train task will build it (`JobSpec`: time limit, partition, env names,
    python, launcher fit), each trial's hyperparameters included; `env` is training.env with its
    values (the document holds the names only)."""
    from pydantic import ValidationError

    from pcflow.slurm.spec import JobSpec

    training = run.training
    trials = run.trials or [{}]
    try:
        for trial in trials:
            JobSpec(
                launcher=training.launcher,
                program=training.program,
                python=training.python,
                resources=training.allocation,
                env=env,
                hyperparameters={**training.hyperparameters, **trial},
                array={"size": len(trials)} if run.trials else None,
            )
    except ValidationError as exc:
        lines = [refusal_line(run, _training_field(error["loc"]), error["msg"]) for error in exc.errors()]
        raise ConfigurationError("invalid Slurm job settings:\n  " + "\n  ".join(lines)) from None


def owned_here(run: PlannedRun, exc: Exception, path: str) -> PcflowInputError:
    """A stage's refusal as this run's first task words it: the owner of its setting decided by the
    run's profile (a `refused` error keeps its setting; any other error is a refusal of `path`)."""
    setting = getattr(exc, "setting", None)
    if isinstance(exc, PcflowInputError) and setting:
        return exc.owned_by(setting_owner(run, setting))
    return refused_setting(run, path, str(exc))


def refusal_line(run: PlannedRun, path: str, problem: str) -> str:
    """One line of a refusal of several settings (errors.refusal), for a setting of this run."""
    return refusal(path, problem, setting_owner(run, path))


def _training_field(loc: tuple) -> str:
    """`JobSpec`'s error location as the run setting's path: ("resources", "time_limit") -> training.time_limit."""
    parts = [str(part) for part in loc]
    if parts[:1] == ["array"]:
        return "trials"
    if parts[:1] == ["resources"]:
        parts = parts[1:]
    return ".".join(["training", *parts])


def check_network(run: PlannedRun) -> None:
    """For a ParallelCluster head node, the SSH sources its config needs (aws/ssh_ingress.py). The section's
    own rules (CIDRs, SSH ingress, ids) were applied when the run spec was read (`NetworkSettings`)."""
    from pcflow.aws.ssh_ingress import head_node_allowed_ips

    if run.cluster.provider != "parallelcluster":
        return
    try:
        head_node_allowed_ips(run.network.ssh_ingress_cidrs)
    except ValueError as exc:
        raise owned_here(run, exc, "network") from None


def check_static_cluster(run: PlannedRun) -> None:
    """A static cluster's settings as the cluster task reads them (`make_provider`'s allowed keys)."""
    if run.cluster.provider != "static":
        return
    from pcflow.cluster.providers import make_provider

    try:
        make_provider("static", cluster=run.cluster.config, ssh_conn_id=run.cluster.ssh_conn_id)
    except (TypeError, ValueError) as exc:
        raise refused_setting(run, "cluster.config", str(exc)) from None


def check_dataset_source(run: PlannedRun, aws_conn_id: str = DEFAULT_AWS_CONN_ID) -> None:
    """The source exists and holds data (the walk the dataset stage does, stopped at the first file):
    a run whose data cannot load fails here, before any network, image or cluster exists."""
    text = run.dataset.source
    try:
        source = parse_source(text)
        if source.kind == "builtin":
            source.builtin_name()
            return
    except SourceRefused as exc:
        raise refused_setting(run, "dataset.source", str(exc)) from None
    from pcflow.dataset.errors import SourceError
    from pcflow.dataset.sources import open_source

    client = None
    if source.kind == "s3":
        from pcflow.aws.clients import aws_client

        client = aws_client("s3", aws_conn_id=aws_conn_id, region_name=run.region)
    try:
        empty = not open_source(source, client).holds_data()
    except SourceError as exc:
        raise refused_setting(run, "dataset.source", str(exc)) from None
    if empty:
        raise refused_setting(run, "dataset.source", f"{text!r} holds no files to load")


def check_cost(run: PlannedRun, aws_conn_id: str = DEFAULT_AWS_CONN_ID) -> Estimate:
    """The run's price per hour and maximum (`pcflow.budget`), logged in one line; refused when its
    budget cannot cap it. Returns the `cost` section the later stages read (approval, the train task's cap)
    and the capacity options priced (what a capacity move logs)."""
    import logging

    from pcflow.budget import plan_cost, refuse_over_budget
    from pcflow.pricing import price_list

    ec2 = None
    if run.capacity_type == "spot":  # spot is priced from EC2's price history of the run's region
        from pcflow.aws.clients import aws_client

        ec2 = aws_client("ec2", aws_conn_id=aws_conn_id, region_name=run.region)
    estimate = plan_cost(run, ec2=ec2, pricing=price_list.pricing_client(aws_conn_id))
    logging.getLogger("airflow.task").info("%s", estimate.cost["summary"])
    refuse_over_budget(estimate.cost, run)
    return estimate


def check_warm_start(run: PlannedRun, inlet_events: Any, aws_conn_id: str = DEFAULT_AWS_CONN_ID) -> dict[str, Any]:
    """The model `training.warm_start` names, resolved against the record its run left (the model's asset
    event: pcflow.warmstart) and its bytes checked against the recorded sha256, before anything is spent: a
    run key or URI with no record, and bytes someone changed, are refused here. `latest` (the nightly's) takes
    the newest recorded model whose object still exists, else starts from scratch: a model the bucket's
    lifecycle or a person deleted must not stop every later night. Returns the resolved provenance
    (`{source, uri, sha256, run}`), the run document's `warm_start`."""
    import logging

    from pcflow import warmstart

    setting = run.training.warm_start
    models = warmstart.stack_models(warmstart.model_events(inlet_events) if setting else [], run.stack)
    try:
        tried = warmstart.candidates(setting, models, bucket=run.dataset.bucket)
    except warmstart.Unrecorded as exc:
        raise refused_setting(run, warmstart.SETTING, str(exc)) from None
    resolved = first_verified(run, tried, aws_conn_id) if tried else None
    log = logging.getLogger("airflow.task")
    if resolved is None:
        if setting:
            log.info(
                "%s: %s: stack %s keeps no model; this run starts from scratch", warmstart.SETTING, setting, run.stack
            )
        return {**warmstart.NOTHING, "source": setting}
    log.info(
        "%s: %s (run %s, sha256 %s), verified", warmstart.SETTING, resolved["uri"], resolved["run"], resolved["sha256"]
    )
    return resolved


def first_verified(run: PlannedRun, tried: list[dict[str, Any]], aws_conn_id: str) -> dict[str, Any] | None:
    """The first of `tried` whose bytes have their recorded sha256 (downloaded bounded, then discarded: the
    warm_start task fetches them again for the cluster). Changed bytes are refused, never skipped; an object
    that is gone is refused when the setting named it, and passed over for an older one under `latest`."""
    import logging
    import tempfile

    from botocore.exceptions import ClientError

    from pcflow import warmstart
    from pcflow.artifacts import ArtifactRefused
    from pcflow.aws.clients import aws_client

    s3 = aws_client("s3", aws_conn_id=aws_conn_id, region_name=run.region)
    for resolved in tried:
        with tempfile.TemporaryDirectory(prefix="pcflow-warm-start-") as directory:
            try:
                warmstart.verify(s3, resolved, directory)
                return resolved
            except ArtifactRefused as exc:
                raise refused_setting(run, warmstart.SETTING, str(exc), ArtifactRefused) from None
            except ClientError as exc:
                if exc.response["Error"]["Code"] not in ("404", "NoSuchKey", "NotFound"):
                    raise
                if resolved["source"] != warmstart.LATEST:
                    raise refused_setting(run, warmstart.SETTING, f"{resolved['uri']} no longer exists") from None
                logging.getLogger("airflow.task").warning(
                    "%s: latest: %s (run %s) no longer exists; trying the model before it",
                    *(warmstart.SETTING, resolved["uri"], resolved["run"]),
                )
    return None
