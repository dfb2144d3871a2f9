"""What can go wrong loading a dataset, as exceptions whose messages tell the user what to do.

They belong to pcflow's family (`pcflow.errors.PcflowError`, an AirflowException): the operator lets
them fail the task as they are, and Airflow retries it (a retry resumes the load). A `SourceError` is
also a ValueError, for callers that check inputs.
"""

from __future__ import annotations

from pcflow.errors import PcflowError


class DatasetError(PcflowError):
    """Base class: the load did not complete; the previous good manifest is still the one readers see."""


class SourceError(DatasetError, ValueError):
    """The source is missing, empty or unreadable: fix the source and run again; nothing was published."""


class SourceChangedError(DatasetError):
    """A source file changed while it was being loaded; the load is refused rather than publish torn data."""


class DestinationError(DatasetError):
    """The bucket is missing, in another region, or the credentials may not write to it."""
