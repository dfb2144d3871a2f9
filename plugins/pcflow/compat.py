"""Names pcflow stores outside its code, and how they keep working across a rename.

Airflow keeps some of pcflow's names in its metadata database, where they outlive a deploy: a deferred
task's trigger is a class path and its keyword arguments, which the triggerer turns back into a trigger
with `import_string(classpath)(**kwargs)`, perhaps under a newer pcflow; a submitted job is remembered
under a task-state key; an extra link's URL is an XCom under a key named after the link's class. A
rename that forgets them strands every task deferred or running at the time. So, within a major
version (CHANGELOG.md):

- a trigger class that moves or is renamed stays importable under its old path: the old module stays,
  as a shim whose `__getattr__ = moved(__name__, {"OldName": "pcflow.new.module.NewName"})`;
- a trigger's `__init__` keeps accepting the keyword arguments a previous release serialised;
- a renamed task-state key keeps its former names in STATE_KEYS, and `read_state` looks them up.

tests/pcflow/test_compat.py rebuilds every trigger each release stored (tests/pcflow/stored/<version>.json),
as the triggerer does, and checks that the names below are the ones the code uses.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any, Protocol

#: Every trigger class path a release of pcflow has stored, with the release that first stored it.
STORED_TRIGGERS: dict[str, str] = {
    "pcflow.slurm.trigger.SlurmJobTrigger": "0.1.0",
    "pcflow.slurm.trigger.SlurmArrayTrigger": "0.1.0",
    "pcflow.metrics.early_stop.EarlyStoppingTrigger": "0.1.0",
    "pcflow.cluster.triggers.ClusterStackTrigger": "0.1.0",
    "pcflow.aws.waits.FsxDataRepositoryTaskTrigger": "0.1.0",
    "pcflow.aws.waits.ImageAvailableTrigger": "0.1.0",
    "pcflow.aws.waits.BakeWaitTrigger": "0.2.0",
    "pcflow.aws.waits.LockReleasedTrigger": "0.2.0",
}

#: Task-state keys by their current name, each with the names it had before (read in that order).
STATE_KEYS: dict[str, tuple[str, ...]] = {
    "slurm_job": (),  # pcflow.slurm.operators.STATE_KEY: {"job_id", "log_offset"} of the submitted job
}

#: XCom keys of the extra links (Airflow names them `_link_<class name>`): renaming a link class renames
#: its key, and the link of a task that ran before would show nothing.
LINK_XCOM_KEYS: dict[str, str] = {
    "_link_MetricsReportLink": "pcflow.metrics.links.MetricsReportLink",
    "_link_MetricsDashboardLink": "pcflow.metrics.links.MetricsDashboardLink",
}


class StateStore(Protocol):
    """What `read_state` needs of Airflow's task state store: one method, so a test can hand in a dict."""

    def get(self, key: str) -> Any:
        """The value stored under `key`, falsy when there is none."""


def read_state(store: StateStore | None, key: str) -> Any:
    """A task-state value under `key`, or under a name it had in an earlier release; None when unset."""
    if store is None:
        return None
    for name in (key, *STATE_KEYS.get(key, ())):
        value = store.get(name)
        if value:
            return value
    return None


def moved(module: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for a shim left at an old path: each old name resolves, on first use, to
    the object now at `names[old name]` ("package.module.Name")."""

    def __getattr__(name: str) -> Any:
        target = names.get(name)
        if target is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        path, _, attribute = target.rpartition(".")
        return getattr(importlib.import_module(path), attribute)

    return __getattr__
