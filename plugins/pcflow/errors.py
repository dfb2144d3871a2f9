"""pcflow's exceptions: one family under `PcflowError` (an `AirflowException`), each message saying
what to do.

The class says how Airflow treats the failure: `PcflowError` and most subclasses fail the try and
let Airflow retry it (a retry resumes, creates nothing twice); `ConfigurationError` fails the task
without retries (a setting is wrong, and a retry would get the same answer). A module's own errors
(`BootstrapFailed`, `ClusterNotOwned`, `DatasetError`...) derive from one of these, so a caller catches
`PcflowError` for anything pcflow raised on purpose.
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
    """A pcflow task could not do its work; the message says why and what to do."""


class ConfigurationError(PcflowError, AirflowFailException, ValueError):
    """A setting of the profile, the run or the operator is wrong: fix it; the task is not retried."""


class ResourceConflict(PcflowError):
    """A resource exists that pcflow may not adopt or change as it is (another stack's, other settings,
    more than one where one is expected)."""


class ServiceFailed(PcflowError):
    """A service reported failure of what pcflow asked of it (a bootstrap script, an FSx task, a stack,
    a cluster's health): its reason is in the message."""


class JobFailed(ServiceFailed):
    """A Slurm job did not succeed."""


class TriggerEventError(PcflowError):
    """A deferred task resumed without a usable event from its trigger (none, not a mapping, no or an
    unknown status): the wait's outcome is unknown, so the task fails rather than guess."""


class WaitFailed(PcflowError):
    """A deferred wait ended in failure (the trigger's event says why)."""
