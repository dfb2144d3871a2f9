"""The janitor: finds pcflow resources whose run is over or whose `pcflow:expires` has passed, and
deletes them with the same convergence loop as every teardown (a second cleanup path, for runs that
were killed before their teardown task ran).

"Run is over" needs to know which runs are alive; the caller passes the run keys of active DAG runs
(`active_run_keys`). Without it, only expiry decides. Shared resources (no `pcflow:run` tag and
`pcflow:expires=never`) are never reaped.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from pcflow.aws.base import PcflowAwsOperator
from pcflow.aws.teardown import DEFAULT_HANDLER_SETS, ClientSource, Selector, TeardownReport, teardown
from pcflow.naming import TAG_EXPIRES, TAG_RUN, parse_expires

log = logging.getLogger(__name__)


def reapable(now: dt.datetime, active_run_keys: Collection[str] | None = None) -> Callable[[Mapping[str, str]], bool]:
    """The janitor's rule on a resource's tags: expired, or belonging to a run that is no longer active."""
    active = None if active_run_keys is None else frozenset(active_run_keys)

    def rule(tags: Mapping[str, str]) -> bool:
        try:
            expires = parse_expires(tags.get(TAG_EXPIRES))
        except ValueError:
            log.warning("unreadable %s=%r: left alone", TAG_EXPIRES, tags.get(TAG_EXPIRES))
            return False
        if expires is not None and expires <= now:
            return True
        run = tags.get(TAG_RUN)
        return active is not None and run is not None and run not in active

    return rule


def run_janitor(
    clients: ClientSource,
    *,
    now: dt.datetime | None = None,
    active_run_keys: Collection[str] | None = None,
    stack: str | None = None,
    dry_run: bool = True,
    handler_sets: Sequence[str] = DEFAULT_HANDLER_SETS,
    **loop_options: Any,
) -> TeardownReport:
    """Reap what `reapable` selects (in one stack, or all pcflow stacks); dry run unless told otherwise."""
    now = now or dt.datetime.now(dt.UTC)
    selector = Selector(stack=stack, predicate=reapable(now, active_run_keys))
    return teardown(clients, selector, handler_sets=handler_sets, dry_run=dry_run, **loop_options)


class JanitorOperator(PcflowAwsOperator):
    """The `janitor` DAG's task. `dry_run=None` means: report only when triggered by hand, delete when
    scheduled (hourly). Returns `TeardownReport.to_xcom()`; fails with the report if something is left.

    :param active_run_keys: run keys of DAG runs still running (e.g. pushed by an upstream task that
        lists running DAG runs and maps them with `naming.run_key`); None = decide by expiry alone.
    """

    template_fields = (*PcflowAwsOperator.template_fields, "stack", "active_run_keys", "dry_run")

    def __init__(
        self,
        *,
        stack: str | None = None,
        active_run_keys: Collection[str] | None = None,
        dry_run: bool | None = None,
        handler_sets: Sequence[str] = DEFAULT_HANDLER_SETS,
        pass_delay: float = 5.0,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.stack = stack
        self.active_run_keys = active_run_keys
        self.dry_run = dry_run
        self.handler_sets = tuple(handler_sets)
        self.pass_delay = pass_delay

    def execute(self, context: Any) -> dict[str, Any]:
        dry_run = self.dry_run
        if dry_run is None:
            dag_run = context.get("dag_run")
            dry_run = str(getattr(dag_run, "run_type", "manual")) in ("manual", "DagRunType.MANUAL")
        self.log.info("janitor: stack %s, dry run %s", self.stack or "<all>", dry_run)
        report = run_janitor(
            self.client,
            active_run_keys=self.active_run_keys,
            stack=self.stack or None,
            dry_run=bool(dry_run),
            handler_sets=self.handler_sets,
            pass_delay=self.pass_delay,
            logger=self.log,
        )
        return report.to_xcom()
