"""Failure alerts: when a task fails for good, tell a person through the Amazon provider's SNS notifier
which stage failed, why, and what is still there.

Which failures alert (`should_alert`): a cleanup's (delete_cluster, teardown, the janitor's reap) in every
DAG, since what it did not delete keeps billing and nobody else would know, also in `pretrain` and
`pretrain_sweep`, whose run failures a person who started them sees; a run's as the profile's
`alerts.on_run_failure` asks (by default only the DAGs on a schedule, which nobody watches); a cost
approval nobody answered in time where `alerts.on_approval_timeout` asks. Each failed task sends at most
one message: the notifier is each task's callback only, never also the DAG's.

The topic is the deployment admin's (`alerts.sns_topic_arn` of the run's profile when the deployment offers
it, else of the deployment's default profile, as for the janitor), read from the profile itself when the
alert is sent, never from the run's conf: a person who triggers a run cannot send its alerts elsewhere. The
notifier is each task's `on_failure_callback` (it runs on the worker after the last try), not the DAG's:
Airflow runs a DAG's callbacks in the DAG processor with the failed task's context but without its
exception, and "why" is the exception. The message is plain text built here and published as data (never
rendered by Jinja): the reason is redacted by Airflow's secrets masker and cut to a bound, and what is still
there is one bounded, time-limited listing of the stack's tagged resources and buckets, whose failure is
reported in the message instead of failing the alert.
"""

from __future__ import annotations

import concurrent.futures
import logging
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow.sdk import BaseNotifier

from pcflow.aws.clients import DEFAULT_AWS_CONN_ID

log = logging.getLogger(__name__)

#: The longest reason a message carries (the task's log has the rest).
MAX_REASON_CHARS = 1000
#: Resources listed one per line; the rest are counted.
MAX_LISTED = 12
#: The listing of what is still there gives up after this long (the alert goes out without it).
LOOKUP_SECONDS = 20.0
#: Each AWS call of that listing: short timeouts, one retry.
LOOKUP_BOTOCORE = {"connect_timeout": 5, "read_timeout": 10, "retries": {"mode": "standard", "max_attempts": 2}}
#: What the listing covers: the teardown's handler sets (ParallelCluster stacks, EC2, FSx, images), and
#: the stack's buckets, sized by S3's CloudWatch metric or a bounded listing (pcflow.aws.kept_buckets).
LISTED_SETS = ("pcluster", "ec2", "fsx", "images")
LOOKUP_SERVICES = ("ec2", "fsx", "cloudformation", "s3", "cloudwatch")
#: Kinds that only make up a network, counted on one line instead of listed.
NETWORK_PARTS = frozenset({"subnet", "security-group", "internet-gateway", "route-table", "network-interface"})
#: SNS refuses a subject longer than this, or one with line breaks or non-ASCII characters.
MAX_SUBJECT_CHARS = 100
#: The longest line of the teardown's report a message carries (an AWS error's text).
MAX_LINE_CHARS = 300
#: What failed (`failure_kind`), and how its subject says so.
CLEANUP, APPROVAL, RUN = "cleanup", "approval", "run"
FAILED = {CLEANUP: "cleanup failed", APPROVAL: "approval not answered", RUN: "failed"}


@dataclass(frozen=True)
class Failure:
    """Which task of which run failed, why, and whose resources to list (stack None: every stack)."""

    dag_id: str
    run_id: str
    task_id: str
    reason: str
    run_key: str
    stack: str | None
    region: str | None = None
    try_number: int | None = None
    log_url: str | None = None
    kind: str = RUN
    #: The cleanup's own report of what it could not delete (`not_deleted`).
    not_deleted: Sequence[str] = ()


@dataclass(frozen=True)
class LeftRunning:
    """The tagged resources still there: priced lines (`pcflow.aws.kept`), or why there are none."""

    lines: Sequence[Mapping[str, Any]] = ()
    usd_per_day: float = 0.0
    unpriced: int = 0
    error: str | None = None
    counted: Mapping[str, int] = field(default_factory=dict)


def alerting_profile(params: Mapping[str, Any]) -> str | None:
    """The profile whose topic hears of a failed run: the one it named when this deployment offers it,
    else the deployment's default. A run refused for its profile (not offered, no such file) is still
    alerted, to the admin's topic, and a name nobody offered never picks the topic."""
    from pcflow.errors import PcflowError
    from pcflow.paths import default_profile, offered_profiles

    named = params.get("profile")
    try:
        offered = offered_profiles()
    except PcflowError:  # the admin's setting is wrong: the default alone is the admin's choice
        offered = []
    return named if named in offered else default_profile()


def alert_settings(profile: str | None) -> Any:
    """The profile's `alerts` section (`AlertsSettings`), checked as the run settings check it."""
    from pcflow.runspec import AlertsSettings, load_profile

    return AlertsSettings.model_validate((load_profile(profile).get("alerts") or {}) if profile else {})


def topic_for(profile: str | None) -> str | None:
    """The profile's `alerts.sns_topic_arn`; None: no alerts."""
    return alert_settings(profile).sns_topic_arn


def failure_kind(task: Any, error: BaseException | str | None) -> str:
    """CLEANUP for a task that deletes what runs leave (an Airflow teardown task, delete_cluster and
    teardown, or any TeardownOperator, the janitor's reap), APPROVAL for a cost approval nobody answered
    within its timeout, RUN for any other."""
    from airflow.providers.standard.exceptions import HITLTimeoutError

    from pcflow.aws.teardown import TeardownOperator

    if getattr(task, "is_teardown", False) is True or isinstance(task, TeardownOperator):
        return CLEANUP
    return APPROVAL if isinstance(error, HITLTimeoutError) else RUN


def runs_unattended(dag: Any) -> bool:
    """A DAG on a schedule (a cron, an asset: the nightly, the janitor) runs with nobody watching; one
    without (pretrain, pretrain_sweep) was started by a person, who sees how it ends."""
    timetable = getattr(dag, "timetable", None)
    return bool(timetable is not None and timetable.can_be_scheduled)


def should_alert(settings: Any, kind: str, *, unattended: bool) -> bool:
    """Whether a failure of this kind alerts under the profile's `alerts` section (a topic set)."""
    if kind == CLEANUP or (kind == APPROVAL and settings.on_approval_timeout):
        return True
    return settings.on_run_failure == "all" or (settings.on_run_failure == "unattended" and unattended)


def where_it_ran(ti: Any, profile: str) -> tuple[str | None, str | None, str | None]:
    """The failed run's key, stack and region: from the first task's document (`ResolvedRun`) where it
    returned one, else the profile's stack and region (the first task itself failed; no key yet)."""
    from pcflow.pipeline.resolved import load
    from pcflow.pipeline.settings import VALIDATE_TASK
    from pcflow.runspec import load_profile

    document = ti.xcom_pull(task_ids=VALIDATE_TASK)
    if document:
        run = load(document)
        return run.run_key, run.stack, run.region
    settings = load_profile(profile)
    return None, settings.get("stack"), settings.get("region")


def not_deleted(error: BaseException | str | None) -> list[str]:
    """What a teardown that failed with its report (`TeardownIncomplete`) left, one line a resource with
    AWS's answer, redacted and bounded; [] for any other error."""
    from pcflow.aws.teardown import TeardownReport

    report = getattr(error, "report", None)
    if not isinstance(report, TeardownReport):
        return []
    lines = [f"{r.describe()}: {report.errors.get(r.key, 'still listed')}" for r in report.remaining]
    lines += [f"{r.describe()}: kept with what it belongs to ({'; '.join(report.hold_reasons)})" for r in report.held]
    return [redacted(line, MAX_LINE_CHARS, " ...") for line in lines]


def redacted(text: str, limit: int, cut: str) -> str:
    """`text` without known secrets (Airflow's masker), cut to `limit` characters and then `cut`."""
    from airflow.sdk.log import redact

    text = str(redact(text)).strip()
    return text if len(text) <= limit else text[:limit].rstrip() + cut


def failure_reason(error: BaseException | str | None) -> str:
    """`Type: message`, without known secrets (Airflow's masker) and at most MAX_REASON_CHARS long."""
    if error is None:
        return "no exception reached the task's failure handler (its process was lost or killed): see its log"
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    more = len(text) - MAX_REASON_CHARS
    return redacted(text, MAX_REASON_CHARS, f" ... ({more} more characters in the log)")


def list_left_running(clients: Callable[[str], Any], stack: str | None, region: str | None) -> LeftRunning:
    """The stack's (every stack's) tagged resources with their cost per day; unbounded in time: see
    `left_running`."""
    import pcflow.cluster.teardown  # noqa: F401 - registers "pcluster", one of LISTED_SETS
    from pcflow.aws.janitor import kept_report
    from pcflow.aws.kept_buckets import kept_buckets
    from pcflow.aws.teardown import Selector, build_handlers
    from pcflow.naming import TAG_EXPIRES, TAG_RUN

    selector = Selector(stack=stack)
    resources = [r for handler in build_handlers(clients, LISTED_SETS) for r in handler.list(selector)]
    resources += kept_buckets(clients, region, stack)
    report = kept_report(resources, region)
    lines, counted = [], Counter()
    for resource, line in zip(resources, report["kept"], strict=True):
        if resource.kind in NETWORK_PARTS or line["basis"] == "counted with its image":
            counted[resource.kind] += 1
        else:
            tags = resource.tags
            lines.append({**line, "state": resource.state, "run": tags.get(TAG_RUN), "expires": tags.get(TAG_EXPIRES)})
    return LeftRunning(lines, report["kept_usd_per_day"], report["kept_unpriced"], counted=dict(counted))


def left_running(clients: Callable[[str], Any], stack: str | None, region: str | None) -> LeftRunning:
    """`list_left_running` within LOOKUP_SECONDS; an error or a timeout becomes the listing's `error`."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="pcflow-alert-lookup")
    try:
        return pool.submit(list_left_running, clients, stack, region).result(timeout=LOOKUP_SECONDS)
    except concurrent.futures.TimeoutError:
        return LeftRunning(error=f"not listed: the lookup took longer than {LOOKUP_SECONDS:g} s")
    except Exception as exc:  # the alert goes out without the listing, saying why
        return LeftRunning(error=f"not listed: {failure_reason(exc)}")
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def alert_subject(failure: Failure) -> str:
    """One line of printable ASCII, as SNS requires of a subject."""
    where = f" (stack {failure.stack})" if failure.stack else ""
    subject = f"pcflow: {failure.dag_id} {FAILED[failure.kind]} at {failure.task_id}{where}"
    return re.sub(r"[^\x20-\x7e]", "?", subject)[:MAX_SUBJECT_CHARS]


def _resource_line(line: Mapping[str, Any]) -> str:
    state = f" ({line['state']})" if line.get("state") else ""
    run = f", run {line['run']}" if line.get("run") else ""
    expires = f", expires {line['expires']}" if line.get("expires") else ""
    usd = "not priced" if line["usd_per_day"] is None else f"${line['usd_per_day']:,.2f}/day"
    return f"  {line['kind']} {line['id']}{state}, stack {line['stack']}{run}{expires}: {usd} ({line['basis']})"


def left_running_text(failure: Failure, left: LeftRunning) -> list[str]:
    """The alert's "still there" section: at most MAX_LISTED resources with their cost per day, the rest
    counted, and what the janitor will do; a listing that failed says why instead."""
    scope = f"stack {failure.stack}" if failure.stack else "every pcflow stack"
    where = f" in {failure.region}" if failure.region else ""
    head = f"Still there ({scope}{where}; tagged EC2, FSx, images, ParallelCluster stacks and buckets):"
    if left.error:
        return [head, f"  {left.error}"]
    if not left.lines and not left.counted:
        return [head, "  nothing"]
    body = [_resource_line(line) for line in left.lines[:MAX_LISTED]]
    if len(left.lines) > MAX_LISTED:
        body.append(f"  ... and {len(left.lines) - MAX_LISTED} more")
    if left.counted:
        parts = ", ".join(f"{count} {kind}" for kind, count in sorted(left.counted.items()))
        body.append(f"  and their network parts and image snapshots: {parts}")
    unpriced = f", {left.unpriced} not priced" if left.unpriced else ""
    total = f"About ${left.usd_per_day:,.2f} per day in all{unpriced}."
    return [
        head,
        *body,
        total,
        "The janitor deletes each once its pcflow:expires passes (never: kept until deleted by hand).",
    ]


def not_deleted_text(failure: Failure) -> list[str]:
    """The alert's "not deleted" section from the teardown's report, at most MAX_LISTED lines (the task log has
    all); nothing when everything went."""
    if not failure.not_deleted:
        return []
    body = [f"  {line}" for line in failure.not_deleted[:MAX_LISTED]]
    if len(failure.not_deleted) > MAX_LISTED:
        body.append(f"  ... and {len(failure.not_deleted) - MAX_LISTED} more (the task's log has them all)")
    return ["Not deleted (the teardown's report):", *body, ""]


def alert_message(failure: Failure, left: LeftRunning) -> str:
    """The text a person reads: the stage, why, the run, what the cleanup left, and what is still there."""
    attempt = f" (try {failure.try_number})" if failure.try_number else ""
    cleanup = " It is a cleanup: what it deletes may still be there, and billing." if failure.kind == CLEANUP else ""
    lines = [
        f"pcflow: {failure.dag_id} failed at stage {failure.task_id}{attempt}.{cleanup}",
        "",
        f"Why: {failure.reason}",
        "",
        *not_deleted_text(failure),
        f"Run: {failure.run_id} (run key {failure.run_key}" + (f", stack {failure.stack})" if failure.stack else ")"),
    ]
    if failure.log_url:
        lines.append(f"Log: {failure.log_url}")
    return "\n".join([*lines, "", *left_running_text(failure, left)])


class FailureAlert(BaseNotifier):
    """A task's `on_failure_callback`: publishes `alert_message` to the profile's SNS topic with the
    provider's `SnsNotifier`, for the failures `should_alert` picks. `every_stack`: what is still there
    is every pcflow stack's (the janitor, which has no profile of its own: the deployment's default
    profile names its topic)."""

    def __init__(self, *, every_stack: bool = False, aws_conn_id: str | None = DEFAULT_AWS_CONN_ID):
        super().__init__()
        self.every_stack = every_stack
        self.aws_conn_id = aws_conn_id

    def notify(self, context: Any) -> None:
        from airflow.providers.amazon.aws.notifications.sns import SnsNotifier

        profile = alerting_profile(context.get("params") or {})
        settings = alert_settings(profile)
        topic = settings.sns_topic_arn
        if topic is None:
            log.info("no alert: profile %s sets no alerts.sns_topic_arn", profile)
            return
        kind = failure_kind(context.get("task"), context.get("exception"))
        if not should_alert(settings, kind, unattended=runs_unattended(context.get("dag"))):
            log.info("no alert: profile %s does not ask for one on a %s failure here (alerts.on_*)", profile, kind)
            return
        failure = self.failure(context, profile, kind)
        try:
            clients = self.lookup_clients(failure.region)
        except Exception as exc:  # no listing, still an alert
            left = LeftRunning(error=f"not listed: {failure_reason(exc)}")
        else:
            left = left_running(clients, failure.stack, failure.region)
        attributes = {"dag_id": failure.dag_id, "task_id": failure.task_id, "stack": failure.stack or "*", "kind": kind}
        SnsNotifier(
            aws_conn_id=self.aws_conn_id,
            target_arn=topic,
            region_name=topic.split(":")[3],  # a topic is published to in its own region
            subject=alert_subject(failure),
            message=alert_message(failure, left),
            message_attributes=attributes,
        ).notify(context)
        log.info("alert published to %s", topic)

    def failure(self, context: Any, profile: str, kind: str = RUN) -> Failure:
        """The facts of the failure: the validated run settings where the first task returned them,
        else the profile's (the first task itself failed); a teardown's report of what it left."""
        from pcflow.naming import run_key

        ti = context["ti"]
        key, stack, region = (None, None, None) if self.every_stack else where_it_ran(ti, profile)
        index = getattr(ti, "map_index", -1)
        error = context.get("exception")
        left = not_deleted(error)  # listed in a section of its own: the reason only counts it
        counted = f"{type(error).__name__}: {len(left)} resource(s) not deleted, listed below"
        return Failure(
            dag_id=ti.dag_id,
            run_id=ti.run_id,
            task_id=ti.task_id + (f"[{index}]" if index is not None and index >= 0 else ""),
            reason=failure_reason(counted if left else error),
            run_key=key or run_key(ti.dag_id, ti.run_id),
            stack=stack,
            region=region,
            try_number=getattr(ti, "try_number", None),
            log_url=getattr(ti, "log_url", None),
            kind=kind,
            not_deleted=left,
        )

    def lookup_clients(self, region: str | None) -> Callable[[str], Any]:
        """The listing's clients, made here (the connection is read in this thread, not the lookup's)."""
        from pcflow.aws.clients import aws_client

        made = {
            service: aws_client(
                service, aws_conn_id=self.aws_conn_id, region_name=region, botocore_config=LOOKUP_BOTOCORE
            )
            for service in LOOKUP_SERVICES
        }
        return made.__getitem__


def with_failure_alerts(dag_args: Mapping[str, Any], **alert: Any) -> dict[str, Any]:
    """`dag_args` (a DAG's keyword arguments) whose `default_args` give every task a `FailureAlert`."""
    default_args = {**(dag_args.get("default_args") or {}), "on_failure_callback": FailureAlert(**alert)}
    return {**dag_args, "default_args": default_args}
