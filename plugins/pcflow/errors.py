"""pcflow's exceptions: one family under `PcflowError` (an `AirflowException`), each message saying
what to do.

The class says how Airflow treats the failure, so no raise site decides it again:
- `PcflowInputError` and its subclasses (`ConfigurationError`, `RunSpecError`, `ConfRefused`,
  `BudgetRefused`, `ClusterSpecError`...): bad input or configuration. They are Airflow's
  `AirflowFailException`, which its task runner fails without retries: a retry would get the same answer.
- Every other `PcflowError` (an SSH connection lost, AWS throttling, Slurm not answering, a stack that
  failed): the try fails and Airflow retries it (a retry resumes, creates nothing twice); except
  `JobFailedForGood`, a Slurm job's end that a retry would repeat, also an `AirflowFailException`.
A module's own errors (`BootstrapFailed`, `ClusterNotOwned`, `DatasetError`...) derive from one of these,
so a caller catches `PcflowError` for anything pcflow raised on purpose.

Subclassing is the one place the mapping lives, as the Amazon provider keeps its errors' meaning in their
classes (`aws/exceptions.py`) rather than in its operators: it holds wherever the error is raised, in an
operator, a `@task` function (the first task is one), a hook or a check, with nothing to wrap.

A refused setting reads the same everywhere (`refusal`): its dotted path, what is wrong, and who may
change it (`profile_admin`, `trigger_user`, `profile_setting`, `connection_admin`,
`deployment_admin`, `task_author`).
"""

from __future__ import annotations

try:
    from airflow.sdk.exceptions import AirflowException, AirflowFailException
except ModuleNotFoundError:  # tests write shards in the payload's environment, which has no Airflow

    class AirflowException(Exception):  # type: ignore[no-redef]
        """Stands in for Airflow's base exception where Airflow is absent."""

    class AirflowFailException(AirflowException):  # type: ignore[no-redef]
        """Stands in for Airflow's fail-without-retry exception where Airflow is absent."""


class PcflowError(AirflowException):
    """A pcflow task could not do its work; the message says why and what to do. Retried by Airflow."""


class PcflowInputError(PcflowError, AirflowFailException, ValueError):
    """Bad input or configuration (a setting of the profile, the run's conf, a connection, an operator's
    argument; a person's refused action): the task fails without retries, as a retry would get the same
    answer. A `ValueError` too, so validation code that catches ValueError (pydantic's validators
    included) treats it as the refusal it is."""

    #: The refused setting's dotted path and what is wrong with it, where `refused` made the error; a
    #: caller that knows better who may change it (the first task knows the profile) rewords it.
    setting: str | None = None
    problem: str | None = None

    def owned_by(self, owner: str) -> PcflowInputError:
        """The same refusal (same class), saying `owner` may change it; one `refused` did not make is
        returned as it is."""
        if self.setting is None:
            return self
        return refused(self.setting, self.problem, owner, type(self))


class ConfigurationError(PcflowInputError):
    """A setting of the profile, the run, a connection or the operator is wrong: fix it."""


class ResourceConflict(PcflowError):
    """A resource exists that pcflow may not adopt or change as it is (another stack's, other settings,
    more than one where one is expected)."""


class ServiceFailed(PcflowError):
    """A service reported failure of what pcflow asked of it (a bootstrap script, an FSx task, a stack,
    a cluster's health): its reason is in the message."""


class JobFailed(ServiceFailed):
    """A Slurm job did not succeed."""


class JobFailedForGood(JobFailed, AirflowFailException):
    """A Slurm job ended in a way a retry would repeat, or that a person chose (pcflow.slurm.outcomes.END_STATES:
    out of memory, a missed deadline, a cancel by a user or an administrator, a completed job without its
    outputs): the task fails without retries."""


class TriggerEventError(PcflowError):
    """A deferred task resumed without a usable event from its trigger (none, not a mapping, no or an
    unknown status): the wait's outcome is unknown, so the task fails rather than guess."""


class WaitFailed(PcflowError):
    """A deferred wait ended in failure (the trigger's event says why)."""


# -- how a refused setting reads ------------------------------------------------------------------


def refusal(setting: str, problem: str | None, owner: str) -> str:
    """The one wording of a refused setting: `<dotted path>: <what is wrong>; <who may change it>`, e.g.
    "training.nodes: 9 is above 4; a trigger user may change this, within the bounds profile 'local' sets".
    `problem` None: the setting is refused whatever its value (a conf may not change it at all)."""
    return f"{setting}: {problem}; {owner}" if problem else f"{setting}: {owner}"


def refused(
    setting: str, problem: str | None, owner: str, kind: type[PcflowInputError] | None = None
) -> PcflowInputError:
    """The error for a refused setting (`kind`, default ConfigurationError), worded by `refusal`."""
    error = (kind or ConfigurationError)(refusal(setting, problem, owner))
    error.setting, error.problem = setting, problem
    return error


def profile_setting() -> str:
    """Who sets a run setting, where the error is raised without the profile's `overridable` at hand (a
    stage's own check): the admin's profile, whatever a conf may have changed within its bounds."""
    return "the deployment admin sets this in the run's profile"


def profile_admin(profile: str) -> str:
    """Who may change a setting profile `profile` does not list as overridable (trust.owner_of decides)."""
    return f"only the deployment admin may change this (profile {profile!r})"


def trigger_user(profile: str | None = None) -> str:
    """Who may change a setting the profile's `overridable` lists, or a part of the run's conf (its
    partition, a sweep's trials); `None`: the profile is not known where the error is raised."""
    where = f"profile {profile!r}" if profile else "the run's profile"
    return f"a trigger user may change this, within the bounds {where} sets"


def connection_admin(conn_id: str) -> str:
    """Who may change a setting of an Airflow connection (its host, login, extras)."""
    return f"only the deployment admin may change this (Airflow connection {conn_id!r})"


def deployment_admin() -> str:
    """Who may change a setting of the deployment itself (an environment variable of Airflow's components)."""
    return "only the deployment admin may change this (an environment variable of Airflow's components)"


def task_author(task_id: str) -> str:
    """Who may change an operator's argument: the DAG it is declared in (pcflow's pipeline passes the
    run's settings, which its first task checks before any of them reach an operator)."""
    return f"the DAG's author sets this (an argument of task {task_id!r})"
