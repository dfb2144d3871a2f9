"""A training run, fully resolved: a profile from `include/profiles/` with the run's conf laid over it.

Every stage reads its settings from this one validated document, so a bad value is refused once,
up front, with the field's path and the values it may take — before anything costs money.
"""

from __future__ import annotations

import datetime as dt
import math
import posixpath
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from pcflow.aws.network_spec import NetworkSettings
from pcflow.capacity import CapacitySettings
from pcflow.datasource import DIGITS
from pcflow.datasource import FORMS as SOURCE_FORMS
from pcflow.errors import refusal
from pcflow.imagerefs import check_fits, parse_image
from pcflow.merge import deep_merge
from pcflow.metric_definitions import parse_definitions
from pcflow.naming import validate_stack_name
from pcflow.paths import PayloadError, ami_script, include_dir, payload_roots, payload_source, profile_names, within
from pcflow.patterns import (
    ABS_PATH,
    ABSURD_USD,
    DEFAULT_CRON,
    DEFAULT_JOB_USER,
    ENTRY_POINT,
    INSTANCE_TYPE,
    JOB_USER,
    MAX_JOB_ACCOUNTS,
    METRIC_NAME,
    NIGHTLY_SCHEDULES,
    PARTITION,
    PAYLOAD_NAME,
    PREFLIGHT_CHECKS,
    SIMPLE_NAME,
    WARM_START,
    check_git_url,
    check_ref,
    job_account_names,
    validate_prefix,
)
from pcflow.profiles import (  # noqa: F401 - where callers found them
    RunSpecError,
    expand_paths,
    load_profile,
    stack_dir,
    with_parent,
)
from pcflow.trust import ConfRefused, Rule, owner_of, parse_rules, refusals

#: The validation context of a run already resolved (`pcflow.resolved`, loaded from XCom): its paths are
#: absolute, as this module's validators made them, and are checked as such.
RESOLVED = "resolved"
BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FsxOwnerSettings(_Section):
    """Whom FSx for Lustre makes the owner of the files it imports from the dataset's prefix: the cluster's
    SSH user (pcflow.dataset.posix), so the partitions are its own and a job reads only its run's."""

    uid: int = Field(ge=0, le=2**31 - 1)
    gid: int = Field(ge=0, le=2**31 - 1)


class DatasetSettings(_Section):
    """Where the run's data comes from and where in S3 its partition goes; the prefix is checked by the dataset
    stage's own rule."""

    source: str = Field(DIGITS, description=SOURCE_FORMS)
    bucket: str
    prefix: str = "datasets/digits"
    mode: Literal["sync", "shard"] = "sync"
    partition: str | None = Field(None, pattern=PARTITION.pattern)
    fsx_owner: FsxOwnerSettings | None = Field(
        None,
        description="the cluster's SSH user's uid and gid, given to what FSx imports; none: root's, readable by all",
    )

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, value: str) -> str:
        if not BUCKET_NAME.fullmatch(value) or ".." in value:
            raise ValueError("must be an S3 bucket name: 3-63 lower-case letters, digits, dots and hyphens")
        return value

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        return validate_prefix(value)  # the dataset stage's own rule


class AmiSettings(_Section):
    """The image to bake: ParallelCluster's version, the admin's bootstrap script in include/ami/ and the
    environment's requirements in a payload root (include/payloads/, examples/) only (no path outside them
    is accepted)."""

    enabled: bool = True
    pcluster_version: str = Field("3.16.1", pattern=r"^\d+\.\d+\.\d+$")
    bootstrap_script: str = Field("ami/bootstrap.sh", validate_default=True, description="a script in include/ami/")
    instance_type: str = "c5.xlarge"
    instance_profile: str = Field("pcflow-ami-builder", pattern=r"^[\w+=,.@-]{1,128}$")
    base_image_id: str | None = Field(None, pattern=r"^ami-[0-9a-f]{8,17}$")
    base_image_owners: list[str] = Field(["amazon"], description="who publishes the ParallelCluster images")
    os: Literal["alinux2023", "ubuntu2204", "ubuntu2404", "rhel8", "rocky8", "rhel9", "rocky9"] = "alinux2023"
    wait_for_ssm_agent: bool = True
    environment: str | None = Field(
        None,
        description="requirements of the environment the image holds, in include/payloads/ or examples/; empty: "
        "the payload's",
    )

    @field_validator("bootstrap_script")
    @classmethod
    def _in_include_ami(cls, value: str, info: ValidationInfo) -> str:
        if value.startswith("/") and (info.context or {}).get(RESOLVED):  # a resolved run's, already absolute
            return str(ami_script(value))
        if value.startswith("/") or ".." in value.split("/"):
            raise ValueError("must be a path relative to include/, without '..', of a script in include/ami/")
        return str(ami_script(value))

    @field_validator("environment")
    @classmethod
    def _in_payload_roots(cls, value: str | None) -> str | None:
        """The requirements the image installs: a file of a payload root (admin-owned), nowhere else."""
        if value is None:
            return None
        path = value if value.startswith("/") else include_dir() / value
        for root in payload_roots():
            try:
                return str(within(path, root))
            except ValueError:
                continue
        raise ValueError(f"{value!r} is not a file of include/payloads/ or examples/")


class ContainerRuntimeSettings(_Section):
    """How the profile's clusters run a container a run names (the deployment admin's): the runtime, where
    OCI image layouts may be read from, the directories every container also sees, and the AWS connection
    whose credentials pull from ECR (pcflow.slurm.images)."""

    runtime: Literal["oci", "pyxis"] | None = Field(
        None,
        description="oci: Slurm's own OCI support (oci.conf, srun --container); pyxis: Pyxis/Enroot "
        "(srun --container-image); empty: the clusters run no containers",
    )
    layouts: list[str] = Field(
        default_factory=list, description="directories an oci:/layout:tag reference must lie under (oci only)"
    )
    mounts: list[str] = Field(
        default_factory=list, description="directories every container also sees, read-only, at the same path"
    )
    registry_conn_id: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.-]{1,250}$",
        description="the AWS connection whose credentials read the image's digest and pull token from ECR; "
        "empty: pcflow's AWS connection",
    )

    @field_validator("layouts", "mounts")
    @classmethod
    def _absolute(cls, value: list[str]) -> list[str]:
        normal = [posixpath.normpath(path) if path.startswith("/") else path for path in value]
        bad = [path for path in normal if not ABS_PATH.fullmatch(path)]
        if bad:
            raise ValueError(f"must be absolute paths of letters, digits and _.@+-/, not {bad}")
        return normal


class ClusterSettings(_Section):
    """Which cluster provider runs the job, the SSH connection to its head node, and the provider's own settings
    (checked by that provider's spec)."""

    provider: Literal["static", "parallelcluster"]
    ssh_conn_id: str = Field("slurm_default", pattern=r"^[A-Za-z0-9_.-]{1,250}$")
    job_user: str | None = Field(
        DEFAULT_JOB_USER,
        description="the unprivileged account jobs run as (the SSH user submits and cancels as it, through "
        "sudo); null: as the SSH user itself, which a job can then change the files of (docs/security.md)",
    )
    job_accounts: int = Field(
        1,
        ge=1,
        le=MAX_JOB_ACCOUNTS,
        description="how many job accounts the cluster keeps (job_user, job_user-1, ...): each run leases one "
        "while it runs, so runs sharing the cluster cannot reach each other's files",
    )
    config: dict[str, Any] = Field(default_factory=dict, description="the provider's own settings")
    containers: ContainerRuntimeSettings = Field(default_factory=ContainerRuntimeSettings)
    suppress_validators: list[str] = Field(default_factory=list)

    @field_validator("job_user")
    @classmethod
    def _job_user(cls, value: str | None) -> str | None:
        if value is not None and not (isinstance(value, str) and JOB_USER.fullmatch(value)):
            raise ValueError(
                f"{value!r} is not a user name: lower-case letters, digits, _ and -, at most 32, not starting "
                "with a digit or -"
            )
        return value

    @model_validator(mode="after")
    def _account_names(self) -> ClusterSettings:
        if self.job_user is not None:
            longest = job_account_names(self.job_user, self.job_accounts)[-1]
            if not JOB_USER.fullmatch(longest):
                raise ValueError(f"job_accounts: the account {longest!r} would not be a user name (at most 32)")
        return self


#: Where the job finds its run's staged data: a hyperparameter the train task sets (pipeline.tasks).
DATA_DIR = "data_dir"
#: Hyperparameters pcflow sets itself (the train task adds them): no profile, conf, trial or grid may.
RESERVED_HYPERPARAMETERS = frozenset({DATA_DIR})


def reserved_hyperparameters(hyperparameters: Any, where: str) -> list[str]:
    """One line per hyperparameter that would replace one pcflow sets: a job told `data_dir: /etc` would
    read (and a payload might write) what the run's staged partition is not."""
    if not isinstance(hyperparameters, dict):
        return []
    return [
        f"{where}.{name}: pcflow sets this itself (the run's staged data on the cluster); a run cannot set it"
        for name in sorted(RESERVED_HYPERPARAMETERS & set(hyperparameters))
    ]


class SecretReference(_Section):
    """A job's secret by reference: an Airflow Variable, or one field of an Airflow Connection (the
    deployment's secrets backend may keep either in AWS Secrets Manager). Read by the first task (a
    missing one refuses the run before spend) and by the train task when it submits; the profile, the
    DAG, XCom and the files on the cluster hold only the reference."""

    variable: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]{1,250}$")
    connection: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]{1,250}$")
    field: Literal["password", "login", "host", "extra"] = "password"

    @model_validator(mode="after")
    def _one_source(self) -> SecretReference:
        if (self.variable is None) == (self.connection is None):
            raise ValueError("a secret names exactly one of `variable` or `connection`")
        if self.variable is not None and "field" in self.model_fields_set:
            raise ValueError("`field` picks a part of a connection; a variable has none")
        return self

    def resolve(self, name: str) -> str:
        """The value, read now; a missing variable or connection (or an empty field) is named."""
        from airflow.sdk import Connection, Variable

        where = f"Airflow variable {self.variable!r}" if self.variable else f"Airflow connection {self.connection!r}"
        try:
            value = (
                Variable.get(self.variable) if self.variable else getattr(Connection.get(self.connection), self.field)
            )
        except Exception:  # the SDK raises its own errors for a missing one; its message may hold nothing useful
            value = None
        if not value:
            raise RunSpecError(
                f"training.env.{name}: {where} {'has no ' + self.field if self.connection else 'is not set'} "
                "(the Airflow admin creates it, or its secrets backend holds it)"
            )
        return str(value)


def secret_references(env: Any) -> list[str]:
    """A conf that names a secret would read any of the deployment's Variables and Connections into its
    job: references come from the profile only, even where the admin lets a conf change training.env."""
    if not isinstance(env, dict):
        return []
    return [
        f"training.env.{name}: a secret reference comes from the profile only (the deployment admin's)"
        for name, value in env.items()
        if isinstance(value, dict)
    ]


class ContainerSettings(_Section):
    """The image a run's job runs in (`training.container`: a reference, or this object), and the
    interpreter inside it that runs the code. The payload contract holds inside: the same PCFLOW_*
    variables, the run's, code and data directories at the paths they have outside, the run's account."""

    image: str = Field(description="oci:/abs/layout:tag (oci runtime) or registry/repository[:tag][@sha256:...]")
    python: str = Field("python3", description="the image's interpreter that runs the code")

    @model_validator(mode="before")
    @classmethod
    def _reference(cls, value: Any) -> Any:
        return {"image": value} if isinstance(value, str) else value

    @field_validator("image")
    @classmethod
    def _image(cls, value: str) -> str:
        parse_image(value)
        return value

    @field_validator("python")
    @classmethod
    def _python(cls, value: str) -> str:
        if not (ABS_PATH.fullmatch(value) or SIMPLE_NAME.fullmatch(value)):
            raise ValueError(f"must be a command name or an absolute path, got {value!r}")
        return value


#: `training.requirements`: a relative path inside the run's code (no leading `/` or `.`; no `..` part).
REQUIREMENTS_PATH = r"^[A-Za-z0-9_][A-Za-z0-9_./+-]{0,199}$"


class EnvironmentSettings(_Section):
    """How the cluster builds a run's environment from `training.requirements` (pcflow.slurm.envs): the
    deployment admin's, never a trigger user's (not in any profile's `overridable`)."""

    builder: str | None = Field(
        None,
        pattern=r"^/[A-Za-z0-9_.@+/-]{1,254}$",
        description="uv on the cluster (an absolute path); null: this cluster builds no environments",
    )
    base: Literal["layered", "isolated"] = Field(
        "layered", description="layered: the base environment's packages are seen and not installed again"
    )
    quota_gib: float = Field(100, gt=0, description="all built environments together; least recently used evicted")
    in_use_hours: float = Field(
        72, gt=0, description="an environment prepared within this many hours is never evicted (a run may use it)"
    )
    index_url: str | None = Field(
        None, pattern=r"^https?://[^@\s]{1,500}$", description="no credentials in it: it reaches the head node's `ps`"
    )
    find_links: list[str] = Field(default_factory=list, description="wheel directories or pages on the cluster")
    no_index: bool = False
    build_timeout_s: float = Field(3600, gt=0, le=6 * 3600)

    def index_options(self) -> list[str]:
        """uv's options for where packages come from, as separate arguments (values passed as data)."""
        options = ["--index-url", self.index_url] if self.index_url else []
        for link in self.find_links:
            options += ["--find-links", link]
        return options + (["--no-index"] if self.no_index else [])


class GitCode(_Section):
    """A git repository and ref; `commit` is the first task's answer to which commit the ref is (never a
    conf's: every later task fetches exactly it)."""

    url: str = Field(description="https://host/org/repo.git, ssh://..., git@host:repo or file:///path")
    ref: str = Field("main", description="a branch, tag or full commit id")
    subdir: str | None = Field(None, description="the project inside the repository (a relative path)")
    conn_id: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_.-]{1,250}$", description="an Airflow git connection for a private repository"
    )
    commit: str | None = Field(None, pattern=r"^[0-9a-f]{40}$", description="set by the first task")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return check_git_url(value)

    @field_validator("ref")
    @classmethod
    def _ref(cls, value: str) -> str:
        return check_ref(value)


class CodeSettings(_Section):
    """The run's own code (pcflow.code): exactly one of a git repository, a directory on the Airflow worker
    (under a root the profile allows), or a tar in S3."""

    git: GitCode | None = None
    dir: str | None = Field(None, description="an absolute directory the profile allows")
    s3: str | None = Field(None, pattern=r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/\S+$", description="a .tar/.tar.gz")

    @field_validator("dir")
    @classmethod
    def _dir(cls, value: str | None) -> str | None:
        if value is not None and not Path(value).is_absolute():
            raise ValueError(f"must be an absolute directory, got {value!r}")
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> CodeSettings:
        given = [name for name in ("git", "dir", "s3") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"name exactly one of git, dir or s3 (got {', '.join(given) or 'none'})")
        return self

    @property
    def kind(self) -> str:
        return "git" if self.git else "dir" if self.dir else "s3"


class BundleSettings(_Section):
    """What a bundle of the run's code may be (the deployment admin's alone: trust.ADMIN_ALONE)."""

    max_mib: float = Field(64, gt=0, le=4096, description="the cap on the code's file content, in MiB")
    allow_secrets: bool = Field(False, description="ship code that looks like it holds a secret (pcflow.secretscan)")

    @property
    def max_bytes(self) -> int:
        return int(self.max_mib * (1 << 20))


class TrainingSettings(_Section):
    """The job: launcher, payload and program, its allocation and environment (secrets by reference only),
    restarts and pending timeout. pcflow's own hyperparameters (`data_dir`) cannot be set here."""

    launcher: Literal["srun", "torchrun", "vissl", "mpirun"] = "srun"
    payload: str | None = Field(
        None,
        pattern=PAYLOAD_NAME.pattern,
        description="a directory of include/payloads/, shipped with each run; program[0] is a script in it",
    )
    code: CodeSettings | None = Field(None, description="the run's own code instead of a payload (pcflow.code)")
    bundle: BundleSettings = Field(default_factory=BundleSettings)
    program: list[str] = Field(min_length=1, description="program[0]: a script in the code, or pkg.module:function")
    hyperparameter_args: bool = Field(
        False, description="also pass the hyperparameters as `--key value` arguments after the program's own"
    )
    python: str = Field("python3", description="the environment's interpreter on the cluster (image or venv)")
    container: ContainerSettings | None = Field(
        None, description="the image the job runs in (cluster.containers says how); empty: on the nodes themselves"
    )
    requirements: str | None = Field(
        None,
        pattern=REQUIREMENTS_PATH,
        description="a requirements file (or a pinned lock) in the run's code; its environment is built once "
        "per cluster and `python`'s environment is its base; null: the code runs in `python` as it is",
    )
    environment: EnvironmentSettings = Field(default_factory=EnvironmentSettings)
    nodes: int = Field(1, ge=1, le=512)
    tasks_per_node: int = Field(1, ge=1, le=128)
    gpus_per_node: int = Field(0, ge=0, le=16)
    cpus_per_task: int = Field(1, ge=1, le=256)
    partition: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    time_limit: str | None = None
    hyperparameters: dict[str, Any] = Field(default_factory=dict)
    hparams_schema: str | None = Field(
        None,
        pattern=REQUIREMENTS_PATH,
        description="the JSON schema of the hyperparameters, a file in the run's code (pcflow.code.hparams): the "
        "first task refuses what it refuses; null: hparams.schema.json at the code's top, if there is one",
    )
    env: dict[str, str | SecretReference] = Field(
        default_factory=dict, description="the job's environment: values, or secrets by reference ({variable: KEY})"
    )
    max_restarts: int = Field(3, ge=0, le=100)
    pending_timeout_s: float | None = Field(None, gt=0)
    warm_start: str | None = Field(
        None,
        pattern=WARM_START.pattern,
        description="start from an earlier run's model: `latest` (the stack's newest), a run key, or the s3:// URI "
        "of a model a run of this stack wrote; loaded only with the sha256 that run recorded (pcflow.warmstart)",
    )

    @field_validator("hyperparameters")
    @classmethod
    def _not_reserved(cls, value: dict[str, Any]) -> dict[str, Any]:
        if lines := reserved_hyperparameters(value, "hyperparameters"):
            raise ValueError("; ".join(lines))
        return value

    @model_validator(mode="after")
    def _code(self) -> TrainingSettings:
        if self.code is None:
            return self
        if self.payload is not None:
            raise ValueError("payload and code are two sources of the run's code: name one")
        script = self.program[0]
        if not ENTRY_POINT.fullmatch(script) and (script.startswith("/") or ".." in script.split("/")):
            raise ValueError(f"program[0] must be a script inside the code or pkg.module:function, got {script!r}")
        return self

    @model_validator(mode="after")
    def _payload(self) -> TrainingSettings:
        if self.payload is not None:
            try:
                payload_source(self.payload)
            except PayloadError as exc:
                raise ValueError(str(exc).removeprefix("payload: ")) from None
            script = self.program[0]
            if script.startswith("/") or ".." in script.split("/"):
                raise ValueError(f"program[0] must be a script inside the payload (e.g. train.py), got {script!r}")
        return self

    @model_validator(mode="after")
    def _container_launcher(self) -> TrainingSettings:
        if self.container is not None and self.launcher not in ("srun", "torchrun"):
            raise ValueError(
                f"container: the {self.launcher} launcher starts its workers outside Slurm's steps, so not in the "
                "container; use srun or torchrun with a container"
            )
        if self.container is not None and self.requirements is not None:
            raise ValueError(
                "container: an environment from training.requirements is built on the nodes, not in an image; "
                "install the requirements in the image, or run without a container"
            )
        return self

    @field_validator("requirements", "hparams_schema")
    @classmethod
    def _inside_the_code(cls, value: str | None) -> str | None:
        if value is not None and ".." in value.split("/"):
            raise ValueError(f"must be a path inside the run's code, without `..` (got {value!r})")
        return value

    @model_validator(mode="after")
    def _requirements(self) -> TrainingSettings:
        if self.requirements is not None and self.environment.builder is None:
            raise ValueError(
                "requirements need a cluster that builds environments: the profile sets no "
                "training.environment.builder (uv's path on the cluster)"
            )
        return self

    def env_values(self) -> dict[str, str]:
        """The job's environment with its secrets read (in the task that needs them, never stored)."""
        return {name: value if isinstance(value, str) else value.resolve(name) for name, value in self.env.items()}

    def secret_references(self) -> dict[str, dict[str, str]]:
        """The secrets among the environment, by reference (no value: these may go through XCom)."""
        return {
            name: value.model_dump(exclude_defaults=True)
            for name, value in self.env.items()
            if isinstance(value, SecretReference)
        }

    def allocation(self) -> dict[str, Any]:
        """The Slurm resources, in `SlurmJobOperator(allocation=...)`'s shape."""
        allocation = {
            "nodes": self.nodes,
            "tasks_per_node": self.tasks_per_node,
            "gpus_per_node": self.gpus_per_node,
            "cpus_per_task": self.cpus_per_task,
            "partition": self.partition,
            "time_limit": self.time_limit,
        }
        return {k: v for k, v in allocation.items() if v is not None}


class TeardownSettings(_Section):
    """What happens to the run's resources when it ends: deleted (`always`) or kept until the janitor's TTL
    (`never`), and how long what runs share is kept for the next one."""

    policy: Literal["always", "never"] = "always"  # never: kept for debugging until the janitor's TTL
    delete_image: bool = False
    keep_hours: float = Field(
        48,
        gt=0,
        le=24 * 30,
        description="what runs keep for the next one (the stack's image; a nightly's network and cluster) "
        "expires this long after the last run that used it; every run stamps it again",
    )
    export_fsx: bool = Field(False, description="write FSx changes (checkpoints) back to S3 before the cluster goes")


class EarlyStoppingSettings(_Section):
    """Stop a trial (scancel) whose metric has not improved for `patience` evaluations or is NaN/inf."""

    patience: int = Field(ge=1, le=10_000)
    min_delta: float = Field(0.0, ge=0)
    metric: str | None = Field(None, pattern=METRIC_NAME.pattern, description="empty: the run's objective")
    mode: Literal["max", "min"] | None = Field(None, description="empty: the objective's mode")


class MetricsSettings(_Section):
    """What the run is judged by (objective and mode), the early-stopping rule, and the metric definitions,
    compiled and checked here so a bad regex is refused before the job runs."""

    objective: str = Field("fewshot_accuracy", pattern=METRIC_NAME.pattern)
    mode: Literal["max", "min"] = "max"
    early_stopping: EarlyStoppingSettings | None = None
    publish_cloudwatch: bool = True
    metric_definitions: list[dict[str, Any]] = Field(
        default_factory=list,
        description='SageMaker-style [{"name": ..., "regex": ...}] (one group: the value) over the job log',
    )

    @field_validator("metric_definitions")
    @classmethod
    def _definitions(cls, value: list[dict[str, Any]]) -> list[dict[str, str]]:
        return [d.as_dict() for d in parse_definitions(value)]


class PreflightSettings(_Section):
    """The account checks a profile skips, by name: for an endpoint (the local emulator) that cannot answer them
    as AWS does. An unknown name is refused."""

    skip: list[str] = Field(
        default_factory=list, description="account checks (pcflow/preflight.py) an endpoint cannot answer as AWS does"
    )

    @field_validator("skip")
    @classmethod
    def _known(cls, value: list[str]) -> list[str]:
        unknown = sorted(set(value) - set(PREFLIGHT_CHECKS))
        if unknown:
            raise ValueError(f"unknown check(s) {', '.join(unknown)}; the checks are {', '.join(PREFLIGHT_CHECKS)}")
        return value


class Approver(_Section):
    """A person who may approve a costly run: Airflow's user id and name (the auth manager's), as the
    human-in-the-loop request's `assigned_users` names them."""

    id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=256)


class BudgetSettings(_Section):
    """What a run may cost (pcflow.budget): its budget (the profile's default; a trigger user may set it
    where `overridable` lists `budget.usd`), the hard maximum no budget may exceed, when a person must
    approve, and how long a kept cluster may sit idle before its compute fleet is stopped."""

    usd: float | None = Field(None, description="the most a run may cost, in USD; empty: max_usd, else no cap")
    max_usd: float | None = Field(None, description="no run's budget may exceed this, whoever sets it")
    approval_above_usd: float | None = Field(None, description="a run whose maximum is above this waits for approval")
    approval_timeout_hours: float = Field(24, gt=0, le=24 * 14)
    approvers: list[Approver] = Field(
        default_factory=list,
        description="who may approve (never the person who triggered the run); empty: anyone who may respond",
    )
    if_maximum_exceeds: Literal["refuse", "cap"] = Field(
        "refuse",
        description="refuse: the first task refuses the run; cap: it starts, and its train task "
        "cancels the job when the cost so far reaches the budget",
    )
    create_minutes: float = Field(40, ge=0, le=24 * 60, description="ParallelCluster's create time, priced")
    delete_minutes: float = Field(20, ge=0, le=24 * 60, description="its delete time (with the FSx export)")
    idle_minutes: float | None = Field(None, gt=0, le=7 * 24 * 60, description="kept cluster: stop its fleet after")
    report_every_s: float = Field(300, ge=5, le=3600, description="the train task logs the cost so far this often")

    @field_validator("usd", "max_usd", "approval_above_usd", mode="before")
    @classmethod
    def _amount(cls, value: Any) -> Any:

        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"must be an amount of US dollars (a number above 0), got {value!r}")
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"{value!r} is not an amount a run can spend: it must be a number above 0")
        if value > ABSURD_USD:
            raise ValueError(f"{value:g} USD is more than any run costs ({ABSURD_USD:g} at most): check the number")
        return float(value)

    @model_validator(mode="after")
    def _within_maximum(self) -> BudgetSettings:
        if self.usd is None and self.max_usd is not None:
            self.usd = self.max_usd  # a hard maximum is a budget: the run is checked and capped at it
        if self.usd is not None and self.max_usd is not None and self.usd > self.max_usd:
            raise ValueError(
                f"budget.usd: {self.usd:g} USD is above the profile's hard maximum of {self.max_usd:g} USD "
                "(budget.max_usd, the deployment admin's)"
            )
        return self


class SweepSettings(_Section):
    """How a sweep's trials share the cluster: at most `max_parallel` of them run at once, each an element of
    the run's job array on nodes of its own (the array's `%` throttle). A trigger user may lower it (or raise
    it, up to what the profile's `overridable` allows); on ParallelCluster the queue is sized for
    `training.nodes` x the trials that run at once."""

    max_parallel: int = Field(
        1,
        ge=1,
        le=1000,
        description="how many of a sweep's trials may run at once, each on `training.nodes` nodes of its own; "
        "1: one after another",
    )


#: Which failed runs alert besides cleanups (pcflow.alerts.should_alert).
RUN_FAILURE_ALERTS = ("unattended", "all", "none")
RUN_FAILURE_CHOICES = (
    "unattended: the DAGs on a schedule (pretrain_nightly, janitor), which nobody watches; all: also those a "
    "person starts (pretrain, pretrain_sweep); none: only cleanups"
)


class AlertsSettings(_Section):
    """Where, and for which failures, pcflow tells a person (pcflow.alerts): the deployment admin's SNS
    topic and choices, read from the profile itself when the alert is sent, never from a run's conf. A
    failed cleanup (delete_cluster, teardown, the janitor's reap) always alerts: it may leave resources
    billing."""

    sns_topic_arn: str | None = Field(
        None,
        pattern=r"^arn:aws[a-z-]*:sns:[a-z0-9-]+:\d{12}:[A-Za-z0-9_-]{1,256}$",
        description="the (standard, not FIFO) topic failures are published to; empty: no alerts",
    )
    on_run_failure: Literal[RUN_FAILURE_ALERTS] = Field("unattended", description=RUN_FAILURE_CHOICES)
    on_approval_timeout: bool = Field(
        False, description="a cost approval nobody answered within budget.approval_timeout_hours alerts, in every DAG"
    )


SCHEDULE_CHOICES = (
    "clock: at `cron`; data: when a partition of the stack's dataset gets new content (an event of its "
    "dataset Asset, `pcflow-dataset-<stack>`), training on that partition"
)


class NightlySettings(_Section):
    """When `pretrain_nightly` starts: read from the deployment's default profile (the one its scheduled
    runs use) when its DAG file is parsed (`pcflow.lineage.nightly_schedule`), checked here by each run."""

    schedule: Literal[NIGHTLY_SCHEDULES] = Field("clock", description=SCHEDULE_CHOICES)
    cron: str = Field(DEFAULT_CRON, description="the clock's cron expression (UTC)")
    warm_start: Literal["latest"] | None = Field(
        None,
        description="latest: each night starts from the stack's newest model (the last successful night's), "
        "unless its conf names `training.warm_start`; null: every night from scratch",
    )

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str) -> str:
        from croniter import croniter  # what Airflow's cron timetables use

        if not croniter.is_valid(value):
            raise ValueError(f"{value!r} is not a cron expression (five fields, e.g. '0 2 * * *')")
        return value


class RunSpec(_Section):
    """The run, fully resolved and validated: every stage reads its settings from this, so a bad value is
    refused once, with its path, before anything is created."""

    profile: str
    stack: str
    region: str
    instance_type: str
    capacity_type: Literal["spot", "ondemand"] = "ondemand"
    #: More instance types, the allocation strategy, a capacity reservation and the fallback options (pcflow.capacity).
    capacity: CapacitySettings = Field(default_factory=CapacitySettings)
    ttl_hours: float = Field(24, gt=0, le=24 * 30)
    network: NetworkSettings = Field(default_factory=NetworkSettings, description="the VPC (aws/network_spec.py)")
    dataset: DatasetSettings
    ami: AmiSettings = Field(default_factory=AmiSettings)
    cluster: ClusterSettings
    training: TrainingSettings
    teardown: TeardownSettings = Field(default_factory=TeardownSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    preflight: PreflightSettings = Field(default_factory=PreflightSettings)
    budget: BudgetSettings = Field(default_factory=BudgetSettings)
    alerts: AlertsSettings = Field(default_factory=AlertsSettings)
    nightly: NightlySettings = Field(default_factory=NightlySettings)
    sweep: SweepSettings = Field(default_factory=SweepSettings)

    @field_validator("stack")
    @classmethod
    def _stack(cls, value: str) -> str:
        return validate_stack_name(value)

    @field_validator("region")
    @classmethod
    def _region(cls, value: str) -> str:
        from pcflow.aws.clients import validate_region  # botocore's region list, as the cluster spec checks it

        return validate_region(value)

    @field_validator("instance_type")
    @classmethod
    def _instance_type(cls, value: str) -> str:
        if not INSTANCE_TYPE.fullmatch(value):
            raise ValueError("must be an EC2 instance type such as g5.12xlarge")
        return value

    @model_validator(mode="after")
    def _image_environment(self) -> RunSpec:
        """The image holds the payload's environment (its requirements), never its code."""
        if self.ami.environment is None and self.training.payload:
            requirements = payload_source(self.training.payload) / "requirements.txt"
            if requirements.is_file():
                self.ami.environment = str(requirements)
        return self

    @model_validator(mode="after")
    def _container_fits(self) -> RunSpec:
        """A named image the profile's clusters can run: their runtime's kind of reference, a layout where
        the admin allows one (pcflow.imagerefs.check_fits)."""
        if self.training.container is not None:
            settings = self.cluster.containers
            try:
                check_fits(parse_image(self.training.container.image), settings.runtime, settings.layouts)
            except ValueError as exc:
                raise ValueError(f"training.container: {exc}") from None
            training = self.training
            if settings.runtime == "oci" and training.launcher == "srun" and training.tasks_per_node > 1:
                raise ValueError(
                    "training.container: Slurm's OCI support runs one task per node in a container (22.05 refuses "
                    "more): tasks_per_node 1, or the torchrun launcher, which starts the node's workers itself"
                )
        return self

    @property
    def ttl(self) -> dt.timedelta:
        return dt.timedelta(hours=self.ttl_hours)


def profiles_dir() -> Path:
    """The profiles shipped with pcflow; a deployment's own come first (`paths.profile_dirs`)."""
    return include_dir() / "profiles"


def available_profiles() -> list[str]:
    """Every profile found, the deployment's and pcflow's own (which of them a run may use is
    `paths.offered_profiles`)."""
    return profile_names()


def profile_rules(name: str) -> dict[str, Rule]:
    """What a trigger user may change in the profile (its `overridable` section)."""
    return parse_rules(expand_paths(load_profile(name).get("overridable")), name)


def format_errors(exc: ValidationError, profile: str, rules: dict[str, Rule]) -> str:
    """One line per invalid field: its path, what is wrong, who may change it (errors.refusal)."""
    lines = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "(top level)"
        lines.append(refusal(where, error["msg"], owner_of(where, rules, profile)))
    return "invalid run settings:\n  " + "\n  ".join(lines)


def resolve_run_spec(profile: str, overrides: dict[str, Any] | None = None) -> RunSpec:
    """The profile, overridden by `overrides`, validated; raises RunSpecError naming each bad field.

    The overrides are taken as given: a run's conf reaches here only through `check_conf`, which
    refuses what the profile does not let a trigger user change. `{include}` is expanded in the
    profile only, never in the overrides."""
    document = expand_paths(load_profile(profile))
    document.pop("overridable", None)
    document = deep_merge(one_code_source(document, overrides or {}), overrides or {})
    document["profile"] = profile
    try:
        return RunSpec.model_validate(document)
    except ValidationError as exc:
        raise RunSpecError(format_errors(exc, profile, profile_rules(profile))) from None


def one_code_source(document: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The profile without its code where the conf names other code: a conf's `training.code` replaces the
    profile's payload and its code (whichever form it was), rather than merging into a run with two.

    The profile's `training.hyperparameters` and `hyperparameter_args` go with its code: they are that
    code's settings (aws-gpu's SimCLR `temperature`), which another project's schema refuses and its
    program would not know. A run of other code (`training.code`, or a payload other than the profile's)
    starts from its own conf's hyperparameters and its program's defaults, as a SageMaker estimator's do."""
    training = overrides.get("training") if isinstance(overrides.get("training"), dict) else {}
    profile_training = document.get("training")
    if not isinstance(profile_training, dict):
        return document
    other_payload = "payload" in training and training["payload"] != profile_training.get("payload")
    if "code" not in training and not other_payload:
        return document
    code_settings = ("code", "payload", "hyperparameters", "hyperparameter_args")
    kept = {key: value for key, value in profile_training.items() if key not in code_settings}
    return {**document, "training": kept}


def check_conf(profile: str, *changes: dict[str, Any], labels: dict[str, str] | None = None) -> None:
    """Refuse (RunSpecError, one line per field) what a run's conf changes beyond the profile's
    `overridable`, and hyperparameters that are pcflow's own; `changes` are partial documents (the form
    and overrides, a sweep's trials and grid points)."""
    try:
        rules = profile_rules(profile)
        found = [line for document in changes for line in refusals(document, rules, profile, labels)]
        for document in changes:
            training = document.get("training") if isinstance(document.get("training"), dict) else {}
            found += reserved_hyperparameters(training.get("hyperparameters"), "training.hyperparameters")
            found += secret_references(training.get("env"))
    except ConfRefused as exc:
        raise RunSpecError(str(exc)) from None
    lines = list(dict.fromkeys(found))
    if lines:
        raise RunSpecError("settings a trigger user may not change:\n  " + "\n  ".join(lines))
