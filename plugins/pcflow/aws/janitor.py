"""The janitor: finds pcflow resources whose `pcflow:expires` has passed, and deletes them with the same
convergence loop as every teardown (a second cleanup path, for runs that were killed before their
teardown task ran). Its report also lists every resource it keeps, with why and what each costs per
day (pcflow.aws.kept), so nothing bills unseen: buckets too (pcflow.aws.kept_buckets), which it never
deletes.

Expiry is not enough on its own: a run may outlive any TTL (requeues, a sweep's trials one after
another), so a resource naming its DAG run (`pcflow:dag-id`, `pcflow:run-id`: the run that made it, or
that last used what a stack keeps) is deleted only once Airflow says that run is finished or gone; a run
queued or running keeps it, whatever its expiry, and an answer Airflow does not give keeps it too
(never delete on doubt). Shared resources (`pcflow:expires=never`) are never reaped. A stack's network,
shared by its runs, is kept while any run holding a reference to it (pcflow.aws.network_users) is
unfinished, or of unknown state; the references of runs that ended without giving theirs back are removed
(`network_users`), after which the network goes by the rule above.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from pcflow.aws.clients import error_code
from pcflow.aws.kept import daily_costs
from pcflow.aws.kept_buckets import kept_buckets
from pcflow.aws.network_users import TAG_REFERENCES, drop_reference, references
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
from pcflow.naming import TAG_COMPONENT, TAG_DAG_ID, TAG_EXPIRES, TAG_RUN_ID, TAG_STACK, Component, parse_expires
from pcflow.prices import NoPrices, price_table

log = logging.getLogger(__name__)

#: What the `janitor` DAG reaps: ParallelCluster stacks, network and instances, file systems, images.
#: `pcluster` is the cluster stage's set: whoever runs the janitor imports pcflow.cluster.teardown, which
#: registers it (dags/janitor.py, pcflow.ui.resources); this module, below the stage, only names it.
JANITOR_HANDLER_SETS = ("pcluster", "ec2", "fsx", "images")
#: DAG run states in which a run may still use what it made (Airflow's DagRunState values).
UNFINISHED = frozenset({"queued", "running"})
#: The state of a DAG run (dag_id, run_id): a DagRunState value, None when Airflow has no such run any
#: more; raises RunStateUnknown when Airflow does not answer.
RunState = Callable[[str, str], "str | None"]


class RunStateUnknown(Exception):
    """Airflow gave no answer on a DAG run's state: the janitor keeps that run's resources."""


def no_airflow(dag_id: str, run_id: str) -> str | None:
    """The run state where no Airflow is asked (a script, the janitor's functions called directly)."""
    raise RunStateUnknown("no Airflow to ask")


class JanitorRule:
    """The janitor's rule on a resource's tags, as a Selector predicate, and why it keeps or reaps each:

    | tags                                        | verdict                       |
    | `pcflow:expires` unreadable                 | kept                          |
    | `never`, or not yet passed                  | kept                          |
    | passed, names a queued/running DAG run      | kept: run active              |
    | passed, Airflow gives no answer on the run  | kept: run state unknown       |
    | passed, the DAG run is finished or gone     | reaped                        |
    | passed, names no DAG run                    | reaped                        |
    | a stack's network a run still uses          | kept: network in use          |

    Airflow is asked only about expired resources, once per DAG run and rule (one janitor pass), and
    about the runs holding references to a network (`network_users`)."""

    def __init__(self, now: dt.datetime, run_state: RunState = no_airflow):
        self.now, self.run_state = now, run_state
        self._states: dict[tuple[str, str], tuple[bool, str]] = {}
        #: Stacks whose shared network a run still uses, with why (filled by `network_users`).
        self.networks_in_use: dict[str, str] = {}

    def __call__(self, tags: Mapping[str, str]) -> bool:
        return self.judge(tags)[0]

    def why(self, tags: Mapping[str, str]) -> str:
        """The reason `judge` gives: what the janitor's report says about a kept or reaped resource."""
        return self.judge(tags)[1]

    def judge(self, tags: Mapping[str, str]) -> tuple[bool, str]:
        """(reap, reason) for a resource's tags."""
        if tags.get(TAG_COMPONENT) == Component.NETWORK and tags.get(TAG_STACK) in self.networks_in_use:
            return False, self.networks_in_use[tags[TAG_STACK]]
        value = tags.get(TAG_EXPIRES)
        try:
            expires = parse_expires(value)
        except ValueError:
            return False, f"kept: unreadable {TAG_EXPIRES}={value!r}"
        if expires is None:
            return False, "kept: never expires"
        if expires > self.now:
            return False, f"kept: expires {value}"
        if TAG_DAG_ID not in tags or TAG_RUN_ID not in tags:
            return True, f"expired {value}; names no DAG run"
        return self.dag_run_verdict(tags[TAG_DAG_ID], tags[TAG_RUN_ID], value)

    def dag_run_verdict(self, dag_id: str, run_id: str, expired: str) -> tuple[bool, str]:
        """(reap, reason) for an expired resource of this DAG run, Airflow asked once per run in a pass."""
        key = (dag_id, run_id)
        if key not in self._states:
            self._states[key] = self._ask(dag_id, run_id, expired)
        return self._states[key]

    def _ask(self, dag_id: str, run_id: str, expired: str) -> tuple[bool, str]:
        try:
            state = self.run_state(dag_id, run_id)
        except RunStateUnknown as exc:
            log.warning("DAG run %s of %s: state unknown (%s); its resources are kept", run_id, dag_id, exc)
            return False, f"kept: run state unknown ({dag_id} {run_id}: {exc})"
        if state in UNFINISHED:
            return False, f"kept: run active ({dag_id} {run_id} is {state}; expired {expired})"
        if state is None:
            return True, f"expired {expired}; DAG run {dag_id} {run_id} no longer exists"
        return True, f"expired {expired}; DAG run {dag_id} {run_id} is {state}"


def network_users(clients: ClientSource, rule: JanitorRule, *, stack: str | None = None, dry_run: bool = True) -> None:
    """Judge the references to every stack's shared network: a stack with a reference whose run is
    unfinished (or of unknown state, or naming no DAG run) goes into `rule.networks_in_use`; a reference
    whose run is finished or gone is stale and removed, unless `dry_run`."""
    # One tag-key filter only: two filters of one name are not both applied by every EC2 (moto keeps the last).
    filters = [{"Name": "tag-key", "Values": [TAG_REFERENCES]}]
    if stack:
        filters.append({"Name": f"tag:{TAG_STACK}", "Values": [stack]})
    s3 = clients("s3")
    for vpc in clients("ec2").describe_vpcs(Filters=filters)["Vpcs"]:
        tags = {t["Key"]: t["Value"] for t in vpc.get("Tags", [])}
        owner, bucket = tags.get(TAG_STACK), tags.get(TAG_REFERENCES)
        if not owner or not bucket:
            continue  # not a shared pcflow network
        users = []
        for ref in _references_or_none(s3, bucket, owner):
            if ref.dag_run is None:
                users.append(f"{ref.run} (names no DAG run)")
                continue
            reap, why = rule.dag_run_verdict(*ref.dag_run, "n/a: a reference")
            if not reap:
                users.append(why.removeprefix("kept: "))
            elif not dry_run:
                log.info("stale reference to the network of stack %s removed: %s", owner, why)
                drop_reference(s3, bucket, owner, ref.run)
        if users:
            rule.networks_in_use[owner] = f"kept: network in use ({'; '.join(users)})"


def _references_or_none(s3: Any, bucket: str, stack: str) -> list[Any]:
    """The references in `bucket`; none when the bucket is gone (nothing can name a user there)."""
    from botocore.exceptions import ClientError

    try:
        return references(s3, bucket, stack)
    except ClientError as error:
        if error_code(error) == "NoSuchBucket":
            return []
        raise


def task_run_state(ti: Any) -> RunState:
    """A DAG run's state as a task asks Airflow: through the Task SDK (`ti.get_dagrun_state`, the
    execution API; task code has no database). Not found (404) is a run that no longer exists; any
    other failure is an unknown answer."""

    def state(dag_id: str, run_id: str) -> str | None:
        try:
            answer = ti.get_dagrun_state(dag_id, run_id)
        except Exception as exc:  # the API's refusal, the supervisor unreachable, no Task SDK at all
            if api_status(exc) == 404:
                return None
            raise RunStateUnknown(f"{type(exc).__name__}: {exc} {api_detail(exc)}".rstrip()) from exc
        return str(getattr(answer, "value", answer))

    return state


def api_status(exc: Exception) -> int | None:
    """The execution API's HTTP status in a failed Task SDK call: relayed by a supervisor process
    (AirflowRuntimeError), or raised as is by an in-process one (`dag.test`: ServerResponseError)."""
    from airflow.sdk.exceptions import AirflowRuntimeError

    if isinstance(exc, AirflowRuntimeError):
        return (exc.error.detail or {}).get("status_code")
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def api_detail(exc: Exception) -> str:
    """The Task SDK error's detail in parentheses (empty when it has none), for the "state unknown" reason."""
    detail = getattr(exc, "detail", None)
    return f"({detail})" if detail else ""


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
    run_state: RunState = no_airflow,
) -> tuple[TeardownReport, list[Resource]]:
    """The janitor's dry run over every stack and what it keeps (as `kept_resources` lists it), from one
    listing of every pcflow resource instead of one for each."""
    everything, rule = Selector(), JanitorRule(now, run_state)
    reaping = [_Listed(handler, everything) for handler in build_handlers(clients, handler_sets)]
    network_users(clients, rule)  # before anything is judged
    images = [] if "images" in handler_sets else [_Listed(h, everything) for h in build_handlers(clients, ["images"])]
    dry_run = converge(reaping, replace(everything, predicate=rule), dry_run=True)
    keeps = replace(everything, predicate=lambda tags: not rule(tags))
    return dry_run, [resource for handler in [*reaping, *images] for resource in handler.list(keeps)]


def kept_report(
    resources: Sequence[Resource], region: str | None, why: Callable[[Resource], str] | None = None
) -> dict[str, Any]:
    """The kept resources with their cost per day (pcflow.aws.kept), and the total of those priced;
    `why` adds each one's reason to its line."""
    try:
        table = price_table(region=region or "us-east-1")
    except NoPrices as exc:
        table, log_note = {}, str(exc)
    else:
        log_note = f"prices: {table['region']} price table as of {table['as_of']}"
    lines = daily_costs(resources, table)
    if why is not None:
        lines = [{**line, "why": why(resource)} for line, resource in zip(lines, resources, strict=True)]
    priced = [line["usd_per_day"] for line in lines if line["usd_per_day"] is not None]
    unpriced = len(lines) - len(priced)
    return {"kept": lines, "kept_usd_per_day": round(sum(priced), 2), "kept_unpriced": unpriced, "prices": log_note}


def run_janitor(
    clients: ClientSource,
    *,
    now: dt.datetime | None = None,
    run_state: RunState = no_airflow,
    stack: str | None = None,
    dry_run: bool = True,
    handler_sets: Sequence[str] = DEFAULT_HANDLER_SETS,
    **loop_options: Any,
) -> TeardownReport:
    """Reap what `JanitorRule` selects (in one stack, or all pcflow stacks); dry run unless told otherwise."""
    rule = JanitorRule(now or dt.datetime.now(dt.UTC), run_state)
    network_users(clients, rule, stack=stack, dry_run=dry_run)
    selector = Selector(stack=stack, predicate=rule)
    return teardown(clients, selector, handler_sets=handler_sets, dry_run=dry_run, **loop_options)


def kept_why(rule: JanitorRule, resource: Resource) -> str:
    """Why the janitor keeps a resource: the rule's reason; a bucket is never the janitor's to delete."""
    return "kept: buckets are never deleted" if resource.kind == "bucket" else rule.why(resource.tags)


def resolve_dry_run(dry_run: bool | None, context: Any) -> bool:
    """The janitor's `dry_run=None`: report only when triggered by hand, act when scheduled."""
    if dry_run is not None:
        return bool(dry_run)
    dag_run = context.get("dag_run")
    return str(getattr(dag_run, "run_type", "manual")) in ("manual", "DagRunType.MANUAL")


class JanitorOperator(TeardownOperator):
    """The `janitor` DAG's task: the teardown operator over every pcflow stack (or `stack`), selecting what
    `JanitorRule` picks, with the state of each expired resource's DAG run asked of Airflow. `dry_run=None`
    means: report only when triggered by hand, delete when scheduled (hourly). Returns
    `TeardownReport.to_xcom()` with what is kept, why, and its cost per day; fails with the report if
    something is left.
    """

    every_stack = True

    def __init__(self, *, stack: str | None = None, dry_run: bool | None = None, **kwargs: Any):
        super().__init__(stack=stack, dry_run=dry_run, **kwargs)

    def is_dry_run(self, context: Any) -> bool:
        return resolve_dry_run(self.dry_run, context)

    def execute(self, context: Any) -> dict[str, Any]:
        dry_run, selection = self.is_dry_run(context), self.selector(context)
        self.log.info("janitor: stack %s, dry run %s", selection.stack or "<all>", dry_run)
        ti = context.get("ti")
        rule = JanitorRule(dt.datetime.now(dt.UTC), task_run_state(ti) if ti is not None else no_airflow)
        network_users(self.client, rule, stack=selection.stack, dry_run=dry_run)
        report = self.converge(replace(selection, predicate=rule), dry_run=dry_run)
        kept = kept_resources(self.client, replace(selection, predicate=lambda tags: not rule(tags)), self.handler_sets)
        buckets = kept_buckets(self.client, self.hook.region_name, selection.stack)
        costs = kept_report([*kept, *buckets], self.hook.region_name, why=lambda resource: kept_why(rule, resource))
        self.log_kept(costs)
        return {**report.to_xcom(), **costs}

    def log_kept(self, costs: dict[str, Any]) -> None:
        """One line per kept resource and the total, as a person reads the janitor's log."""
        for line in costs["kept"]:
            usd = f"${line['usd_per_day']:,.2f}/day" if line["usd_per_day"] is not None else "not priced"
            where = f"{line['kind']} {line['id']} (stack {line['stack']})"
            self.log.info("%s: %s; %s, %s", line["why"], where, usd, line["basis"])
        unpriced = f", {costs['kept_unpriced']} not priced" if costs["kept_unpriced"] else ""
        count, total = len(costs["kept"]), costs["kept_usd_per_day"]
        self.log.info("kept: %d resource(s), $%.2f per day%s (%s)", count, total, unpriced, costs["prices"])
