"""The janitor: finds pcflow resources whose run is over or whose `pcflow:expires` has passed, and
deletes them with the same convergence loop as every teardown (a second cleanup path, for runs that
were killed before their teardown task ran). Its report also lists every resource it keeps, with what
each costs per day (pcflow.aws.kept), so nothing bills unseen: buckets too (pcflow.aws.kept_buckets),
which it never deletes.

"Run is over" needs to know which runs are alive; the caller passes the run keys of active DAG runs
(`active_run_keys`). Without it, only expiry decides. Shared resources (no `pcflow:run` tag and
`pcflow:expires=never`) are never reaped.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from pcflow.aws.base import aws_template_fields
from pcflow.aws.kept_buckets import kept_buckets
from pcflow.aws.teardown import (
    DEFAULT_HANDLER_SETS,
    ClientSource,
    Resource,
    ResourceHandler,
    Selector,
    TeardownOperator,
    TeardownReport,
    build_handlers,
    converge,
    teardown,
)
from pcflow.naming import TAG_EXPIRES, TAG_RUN, parse_expires

log = logging.getLogger(__name__)

#: What the `janitor` DAG reaps: ParallelCluster stacks, network and instances, file systems, images.
JANITOR_HANDLER_SETS = ("pcluster", "ec2", "fsx", "images")


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


def kept_resources(
    clients: ClientSource, selector: Selector, handler_sets: Sequence[str] = DEFAULT_HANDLER_SETS
) -> list[Resource]:
    """What `selector` picks in `handler_sets` and among the images; given the janitor's rule negated, what
    the janitor leaves, which keeps billing."""
    handlers = build_handlers(clients, dict.fromkeys([*handler_sets, "images"]))
    return [resource for handler in handlers for resource in handler.list(selector)]


class _Listed:
    """A handler whose resources were listed once: a selector picks from that listing, without calling
    AWS again (deleting, holding and ordering are still the handler's)."""

    def __init__(self, handler: ResourceHandler, everything: Selector):
        self.handler, self.kind, self.order = handler, handler.kind, handler.order
        self.resources = handler.list(everything)

    def list(self, selector: Selector) -> list[Resource]:
        return [resource for resource in self.resources if selector.matches(resource.tags)]

    def prepare(self, resources: Sequence[Resource]) -> None:
        self.handler.prepare(resources)

    def delete(self, resource: Resource) -> None:
        self.handler.delete(resource)

    def holds(self, resources: Sequence[Resource]) -> dict[tuple[str, str], str]:
        return self.handler.holds(resources)


def janitor_view(
    clients: ClientSource,
    now: dt.datetime,
    handler_sets: Sequence[str] = JANITOR_HANDLER_SETS,
    active_run_keys: Collection[str] | None = None,
) -> tuple[TeardownReport, list[Resource]]:
    """The janitor's dry run over every stack and what it keeps (as `kept_resources` lists it), from one
    listing of every pcflow resource instead of one for each."""
    everything, rule = Selector(), reapable(now, active_run_keys)
    reaping = [_Listed(handler, everything) for handler in build_handlers(clients, handler_sets)]
    images = [] if "images" in handler_sets else [_Listed(h, everything) for h in build_handlers(clients, ["images"])]
    dry_run = converge(reaping, replace(everything, predicate=rule), dry_run=True)
    keeps = replace(everything, predicate=lambda tags: not rule(tags))
    return dry_run, [resource for handler in [*reaping, *images] for resource in handler.list(keeps)]


def kept_report(resources: Sequence[Resource], region: str | None) -> dict[str, Any]:
    """The kept resources with their cost per day (pcflow.aws.kept), and the total of those priced."""
    from pcflow.aws.kept import daily_costs
    from pcflow.metrics.cost import NoPrices, price_table

    try:
        table = price_table(region=region or "us-east-1")
    except NoPrices as exc:
        table, log_note = {}, str(exc)
    else:
        log_note = f"prices: {table['region']} price table as of {table['as_of']}"
    lines = daily_costs(resources, table)
    priced = [line["usd_per_day"] for line in lines if line["usd_per_day"] is not None]
    unpriced = len(lines) - len(priced)
    return {"kept": lines, "kept_usd_per_day": round(sum(priced), 2), "kept_unpriced": unpriced, "prices": log_note}


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


def resolve_dry_run(dry_run: bool | None, context: Any) -> bool:
    """The janitor's `dry_run=None`: report only when triggered by hand, act when scheduled."""
    if dry_run is not None:
        return bool(dry_run)
    dag_run = context.get("dag_run")
    return str(getattr(dag_run, "run_type", "manual")) in ("manual", "DagRunType.MANUAL")


class JanitorOperator(TeardownOperator):
    """The `janitor` DAG's task: the teardown operator over every pcflow stack (or `stack`), selecting what
    `reapable` picks. `dry_run=None` means: report only when triggered by hand, delete when scheduled
    (hourly). Returns `TeardownReport.to_xcom()` with what is kept and its cost per day; fails with the
    report if something is left.

    :param active_run_keys: run keys of DAG runs still running (e.g. pushed by an upstream task that
        lists running DAG runs and maps them with `naming.run_key`); None = decide by expiry alone.
    """

    template_fields: Sequence[str] = aws_template_fields(*TeardownOperator.template_fields, "active_run_keys")
    every_stack = True

    def __init__(
        self,
        *,
        stack: str | None = None,
        active_run_keys: Collection[str] | None = None,
        dry_run: bool | None = None,
        **kwargs: Any,
    ):
        super().__init__(stack=stack, dry_run=dry_run, **kwargs)
        self.active_run_keys = active_run_keys

    def is_dry_run(self, context: Any) -> bool:
        return resolve_dry_run(self.dry_run, context)

    def execute(self, context: Any) -> dict[str, Any]:
        dry_run, selection = self.is_dry_run(context), self.selector(context)
        self.log.info("janitor: stack %s, dry run %s", selection.stack or "<all>", dry_run)
        rule = reapable(dt.datetime.now(dt.UTC), self.active_run_keys)
        report = self.converge(replace(selection, predicate=rule), dry_run=dry_run)
        kept = kept_resources(self.client, replace(selection, predicate=lambda tags: not rule(tags)), self.handler_sets)
        buckets = kept_buckets(self.client, self.hook.region_name, selection.stack)
        costs = kept_report([*kept, *buckets], self.hook.region_name)
        self.log_kept(costs)
        return {**report.to_xcom(), **costs}

    def log_kept(self, costs: dict[str, Any]) -> None:
        """One line per kept resource and the total, as a person reads the janitor's log."""
        for line in costs["kept"]:
            usd = f"${line['usd_per_day']:,.2f}/day" if line["usd_per_day"] is not None else "not priced"
            self.log.info("kept: %s %s (stack %s): %s, %s", line["kind"], line["id"], line["stack"], usd, line["basis"])
        unpriced = f", {costs['kept_unpriced']} not priced" if costs["kept_unpriced"] else ""
        count, total = len(costs["kept"]), costs["kept_usd_per_day"]
        self.log.info("kept: %d resource(s), $%.2f per day%s (%s)", count, total, unpriced, costs["prices"])
