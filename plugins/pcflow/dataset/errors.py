"""What can go wrong loading a dataset, as exceptions whose messages tell the user what to do.

They derive from ValueError/RuntimeError (not Airflow's exceptions) so the plain functions stay usable
outside Airflow; the operator lets them fail the task as they are.
"""

from __future__ import annotations


class DatasetError(RuntimeError):
    """Base class: the load did not complete; the previous good manifest is still the one readers see."""


class SourceError(DatasetError, ValueError):
    """The source is missing, empty or unreadable: fix the source and run again; nothing was published."""


class SourceChangedError(DatasetError):
    """A source file changed while it was being loaded; the load is refused rather than publish torn data."""


class DestinationError(DatasetError):
    """The bucket is missing, in another region, or the credentials may not write to it."""
