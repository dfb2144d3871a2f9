"""The shapes of user-supplied values that both the run spec (pydantic) and the trigger form (the
Params' JSON schema) check, and the choices they share. Plain regular expressions and string checks,
so a DAG file builds its form without importing the run-spec models, and the run spec imports no stage."""

from __future__ import annotations

import re

from pcflow.errors import ConfigurationError

INSTANCE_TYPE = re.compile(r"^[a-z][a-z0-9-]*\d[a-z0-9-]*\.[a-z0-9]+$")
#: An EC2 availability zone's name (us-east-1b): where a capacity fallback's queue launches (pcflow.capacity).
AVAILABILITY_ZONE = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$")
#: No training run pcflow makes costs this much: a budget above it is a typo, not a budget (the run spec's
#: check of `budget.usd`, below pcflow.budget, which takes the run spec).
ABSURD_USD = 1_000_000.0
#: The account checks pcflow.preflight runs, in order, by the names a profile's `preflight.skip` may list (the
#: run spec refuses another name without importing the checks, which use the cluster stage).
PREFLIGHT_CHECKS = ("key_pair", "instance_types_offered", "vcpu_quota", "builder_instance_profile", "pcluster_cli")
#: A metric's name, as a metric definition, the objective and early stopping name it (pcflow.metric_definitions).
METRIC_NAME = re.compile(r"^[A-Za-z0-9_.:/\-]{1,128}$")
#: A dataset partition: one path segment under the dataset prefix (a date for scheduled runs).
PARTITION = re.compile(r"^[A-Za-z0-9=_.-]{1,64}$")
#: A payload's name (`training.payload`): a directory of a payload root (pcflow.paths.payload_source).
PAYLOAD_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,40}$")
#: A profile's name (its file is `<name>.yaml` in a profile directory).
PROFILE_NAME = re.compile(r"^[a-z][a-z0-9-]{0,40}$")
#: The account a cluster's jobs run as (a profile's `cluster.job_user`): a POSIX user name, as useradd takes it.
JOB_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
#: What the shipped profiles name it; the local stack and ParallelCluster's nodes create it.
DEFAULT_JOB_USER = "pcflow-job"
#: The most job accounts a cluster keeps for its runs (a profile's `cluster.job_accounts`).
MAX_JOB_ACCOUNTS = 64


def job_account_names(job_user: str, count: int) -> list[str]:
    """The accounts a cluster keeps for its runs' jobs: `job_user` itself, then `<job_user>-1` ...
    `<job_user>-<count - 1>` (on ParallelCluster's nodes with uids `job_uid + index`). Each run leases one
    for as long as it runs (pcflow.slurm.accounts), so two runs sharing a cluster cannot reach each
    other's files; a pool of one is the stack's single account."""
    return [job_user] + [f"{job_user}-{index}" for index in range(1, count)]


#: When the nightly runs (a profile's `nightly.schedule`): at `nightly.cron`, or when its stack's data is new.
NIGHTLY_SCHEDULES = ("clock", "data")
DEFAULT_CRON = "0 2 * * *"


#: A dataset's key prefix: S3-safe characters, no empty, `.` or `..` segments (stage-in maps keys to paths).
PREFIX_RE = re.compile(r"^[A-Za-z0-9!_.*'()/-]{1,512}$")


def validate_prefix(prefix: str) -> str:
    """The prefix without its outer slashes; refused unless every segment is a plain name."""
    stripped = prefix.strip("/") if isinstance(prefix, str) else ""
    if not PREFIX_RE.fullmatch(stripped) or any(part in ("", ".", "..") for part in stripped.split("/")):
        raise ConfigurationError(
            f"invalid dataset prefix {prefix!r}: use S3 key segments of letters, digits and !_.*'()- "
            "separated by single slashes, none of them '.' or '..' (for example 'datasets/imagenet')"
        )
    return stripped


#: `pkg.module:function`: a program[0] that names a function in the run's code rather than a script.
ENTRY_POINT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")

#: A run key as pcflow.naming makes it: lowercase letters, digits and dashes, at most 48.
RUN_KEY = re.compile(r"^[a-z0-9][a-z0-9-]{0,47}$")
#: What `training.warm_start` may name: `latest` (the stack's newest model), a run key, or an s3:// URI of a
#: model a run of the stack wrote (`runs/<run key>/model/...`); the first task checks it against the record.
WARM_START = re.compile(r"^(latest|[a-z0-9][a-z0-9-]{0,47}|s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/[^\s\x00]{1,1024})$")
LATEST = "latest"


#: An absolute path on the cluster as pcflow hands one to Slurm, a shell or a container's mounts: letters,
#: digits and _.@+-/ only (no space, quote or glob), so it needs no quoting in an `#SBATCH` line.
ABS_PATH = re.compile(r"^/[A-Za-z0-9_.@+/\-]{0,1023}$")
#: A simple name Slurm reads in a directive or pcflow puts in a path on the cluster (a partition, a job's
#: name, a run key and task, a command on the PATH): letters, digits and _.-, at most 128.
SIMPLE_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")


#: A job's time limit as sbatch's `--time` reads it (the run spec's `training.time_limit`).
TIME_LIMIT = re.compile(r"^(\d+-)?\d{1,4}(:\d{2}){0,2}$|^UNLIMITED$|^INFINITE$")


def time_limit_seconds(text: str | None) -> int | None:
    """A time limit as sbatch reads `--time` (`minutes`, `minutes:seconds`, `hours:minutes:seconds`,
    `days-hours`, `days-hours:minutes`, `days-hours:minutes:seconds`) in seconds; None when it is unset
    or unlimited (the partition's limit then applies, which pcflow does not know)."""
    if text is None or not TIME_LIMIT.fullmatch(text) or text in ("UNLIMITED", "INFINITE"):
        return None
    days, _, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if days:  # days-hours[:minutes[:seconds]]
        hours, minutes, seconds = [*parts, 0, 0][:3]
    elif len(parts) == 3:  # hours:minutes:seconds
        hours, minutes, seconds = parts
    else:  # minutes[:seconds]
        hours, minutes, seconds = 0, parts[0], ([*parts, 0])[1]
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds


#: A git commit id, as the first task pins a ref to one (pcflow.code.sources.resolve_commit).
COMMIT = re.compile(r"^[0-9a-f]{40}$")
#: A ref as git spells one (git check-ref-format, roughly): no option, no `..`, no control characters.
REF = re.compile(r"^(?!-)(?!.*\.\.)[A-Za-z0-9._/@+-]{1,200}$")
#: The URL forms pcflow fetches from: https, ssh (both spellings) and file:// (an absolute path).
GIT_URL = re.compile(r"^(https://[^/@\s]+/\S+|ssh://[^\s]+|[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[^\s]+|file:///\S*)$")


def check_git_url(url: object) -> str:
    """`url` if it is a form pcflow fetches (GIT_URL), without credentials in it; else ValueError (the run
    spec's `training.code.git.url`; the code stage refuses it as BundleRefused before it asks git)."""
    if not isinstance(url, str) or not GIT_URL.fullmatch(url) or url.startswith("-"):
        raise ValueError(
            f"{url!r} is not a git URL pcflow fetches (https://host/repo, ssh://..., git@host:repo or file:///path)"
        )
    if re.match(r"^https://[^/]*@", url):
        raise ValueError("a git URL carries no credentials: put the token in an Airflow connection (conn_id)")
    return url


def check_ref(ref: object) -> str:
    """`ref` if git could name a branch, tag or commit by it; else ValueError (as `check_git_url`)."""
    if not isinstance(ref, str) or not REF.fullmatch(ref):
        raise ValueError(f"{ref!r} is not a git branch, tag or commit")
    return ref
