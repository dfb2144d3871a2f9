"""The failure alert's text and its parts, offline: the subject SNS accepts, the reason bounded and without
known secrets, what is still there listed with its cost per day and bounded (a failed or slow lookup
becomes a line of the message, not a failed alert), the topic read from the admin's profile only.
About a second."""

from __future__ import annotations

import dataclasses
import time
from typing import ClassVar

import pytest

from pcflow import alerts
from pcflow.alerts import (
    MAX_LISTED,
    MAX_REASON_CHARS,
    FailureAlert,
    LeftRunning,
    alert_message,
    alert_subject,
    alerting_profile,
    failure_reason,
    left_running,
    topic_for,
)
from pcflow.aws.teardown import Handler, Resource, register_handlers
from pcflow.runspec import AlertsSettings, RunSpecError, check_conf

TOPIC = "arn:aws:sns:us-east-1:123456789012:pcflow-alerts"
FAILURE = alerts.Failure(
    dag_id="pretrain_nightly",
    run_id="scheduled__2026-11-29T02:00:00+00:00",
    task_id="cluster",
    reason="RuntimeError: the head node did not answer",
    run_key="pretrain-nightly-sched-abc",
    stack="research",
    region="us-east-1",
    try_number=3,
    log_url="http://airflow.example/dags/pretrain_nightly/runs/x/tasks/cluster",
)
TAGS = {"pcflow:stack": "research", "pcflow:expires": "2026-12-01T02:00:00Z"}


class Listed(Handler):
    """A handler set standing for the teardown's: lists what it was given."""

    kind, order = "any", 0

    def __init__(self, resources):
        self.resources = resources

    def list(self, selector):
        return [r for r in self.resources if selector.matches(r.tags)]


def listing(monkeypatch, *resources: Resource, buckets: tuple[Resource, ...] = ()) -> None:
    """The teardown's handler sets and the bucket lookup (pcflow.aws.kept_buckets) answer these."""
    register_handlers("alerts-test", lambda clients: [Listed(list(resources))], replace=True)
    monkeypatch.setattr(alerts, "LISTED_SETS", ("alerts-test",))
    monkeypatch.setattr("pcflow.aws.kept_buckets.kept_buckets", lambda clients, region, stack: list(buckets))


def test_the_message_names_the_stage_why_the_run_and_what_is_still_there(monkeypatch):
    listing(
        monkeypatch,
        Resource("instance", "i-head", {**TAGS, "pcflow:run": "r1"}, "running", {"InstanceType": "c5.2xlarge"}),
        Resource("vpc", "vpc-1", TAGS, "available"),
        Resource("subnet", "subnet-1", TAGS),
        Resource("subnet", "subnet-2", TAGS),
        Resource("security-group", "sg-1", TAGS),
        Resource("vpc", "vpc-other", {"pcflow:stack": "someone-else"}),
        buckets=(Resource("bucket", "research-data", TAGS, "", {"Bytes": 500 * 2**30, "BytesSource": "listed"}),),
    )
    left = left_running(lambda service: None, "research", "us-east-1")
    message = alert_message(FAILURE, left)
    assert message.startswith("pcflow: pretrain_nightly failed at stage cluster (try 3).")
    assert "Why: RuntimeError: the head node did not answer" in message
    assert "Run: scheduled__2026-11-29T02:00:00+00:00 (run key pretrain-nightly-sched-abc, stack research)" in message
    assert f"Log: {FAILURE.log_url}" in message
    assert "Still there (stack research in us-east-1;" in message
    head = "instance i-head (running), stack research, run r1, expires 2026-12-01T02:00:00Z: $8.16/day"
    assert head in message  # c5.2xlarge at $0.34/h, the dated table's price
    assert "vpc vpc-1 (available), stack research, expires 2026-12-01T02:00:00Z: $0.00/day (free)" in message
    assert "network parts and image snapshots: 1 security-group, 2 subnet" in message
    assert "vpc-other" not in message  # another stack's
    bucket = "bucket research-data, stack research, expires 2026-12-01T02:00:00Z: $0.38/day (500.0 GiB in S3 Standard"
    assert bucket in message  # 500 GiB x $0.023 per GiB-month / 730 h x 24 h
    assert "About $8.54 per day in all." in message


def test_what_is_still_there_is_bounded(monkeypatch):
    many = [Resource("image", f"ami-{i:04d}", TAGS, "available") for i in range(MAX_LISTED + 5)]
    listing(monkeypatch, *many)
    message = alert_message(FAILURE, left_running(lambda service: None, "research", "us-east-1"))
    assert message.count("  image ami-") == MAX_LISTED
    assert "... and 5 more" in message


def test_every_stack_for_the_janitor(monkeypatch):
    listing(
        monkeypatch, Resource("vpc", "vpc-a", {"pcflow:stack": "a"}), Resource("vpc", "vpc-b", {"pcflow:stack": "b"})
    )
    janitor = alerts.Failure("janitor", "scheduled__x", "reap", "TeardownIncomplete: 1 left", "janitor-x", None)
    message = alert_message(janitor, left_running(lambda service: None, None, None))
    assert "Still there (every pcflow stack;" in message and "vpc-a" in message and "vpc-b" in message
    assert alert_subject(janitor) == "pcflow: janitor failed at reap"


def test_a_failed_lookup_is_a_line_of_the_message_not_a_failed_alert():
    def clients(service):
        raise ConnectionError("endpoint unreachable")

    left = left_running(clients, "research", "us-east-1")
    assert left.error == "not listed: ConnectionError: endpoint unreachable"
    assert "  not listed: ConnectionError: endpoint unreachable" in alert_message(FAILURE, left)


def test_a_slow_lookup_is_given_up(monkeypatch):
    monkeypatch.setattr(alerts, "LOOKUP_SECONDS", 0.2)
    monkeypatch.setattr(alerts, "list_left_running", lambda *args: time.sleep(2))
    started = time.monotonic()
    left = left_running(lambda service: None, "research", "us-east-1")
    assert time.monotonic() - started < 1.5
    assert left.error == "not listed: the lookup took longer than 0.2 s"


def test_the_reason_is_bounded_and_hides_known_secrets():
    from airflow.sdk.log import mask_secret

    mask_secret("hunter2-s3cr3t-token")
    reason = failure_reason(RuntimeError("login with hunter2-s3cr3t-token failed"))
    assert reason == "RuntimeError: login with *** failed"
    long = failure_reason(ValueError("x" * 5000))
    assert len(long) < MAX_REASON_CHARS + 80 and long.endswith("more characters in the log)")
    assert "process was lost" in failure_reason(None)


def test_the_subject_is_what_sns_accepts():
    odd = alerts.Failure("pretrain_nightly", "r", "tâche\nnext" + "x" * 200, "why", "key", "research")
    subject = alert_subject(odd)
    assert len(subject) <= 100 and subject.isascii() and "\n" not in subject
    assert alert_subject(FAILURE) == "pcflow: pretrain_nightly failed at cluster (stack research)"


def test_nothing_still_there_says_so():
    assert "  nothing" in alert_message(FAILURE, LeftRunning())


def test_the_topic_is_the_admin_s_and_a_trigger_user_cannot_change_it(admin_profiles):
    assert topic_for("local") is None  # the emulator: nobody reads its topics
    assert topic_for("aws-gpu") == TOPIC  # the admin replaces the account id
    assert topic_for("aws-gpu-rehearsal") == TOPIC  # inherited from aws-gpu
    other = admin_profiles.make("local", {"alerts": {"sns_topic_arn": TOPIC.replace("alerts", "alerts-ml")}})
    assert topic_for(other) == TOPIC.replace("alerts", "alerts-ml")
    for profile in ("local", "aws-gpu"):
        with pytest.raises(RunSpecError, match=r"alerts\.sns_topic_arn: only the deployment admin may change this"):
            check_conf(profile, {"alerts": {"sns_topic_arn": "arn:aws:sns:us-east-1:999999999999:mine"}})


@pytest.mark.parametrize(
    "arn",
    [
        "https://hooks.example/x",
        "arn:aws:sqs:us-east-1:123456789012:q",
        "arn:aws:sns:us-east-1:1234:t",
        TOPIC + ".fifo",
    ],
)
def test_only_a_standard_sns_topic_arn_is_a_topic(arn):
    with pytest.raises(ValueError, match="sns_topic_arn"):
        AlertsSettings(sns_topic_arn=arn)


def test_no_topic_no_aws_call(monkeypatch):
    """The local profile: the notifier returns before it reads a connection or lists anything."""
    monkeypatch.setattr(alerts, "left_running", lambda *args: pytest.fail("listed without a topic"))
    FailureAlert().notify({"params": {"profile": "local"}})


@pytest.mark.parametrize("named", ["aws-gpu-rehearsal", "no-such-profile", "../local", None])
def test_a_run_refused_for_its_profile_alerts_the_default_s_topic(monkeypatch, named):
    """The named profile's topic only when the deployment offers it; otherwise the default's, so the run
    refused for its profile still reaches the admin, and a name nobody offered never picks the topic."""
    monkeypatch.setenv("PCFLOW_DEFAULT_PROFILE", "aws-gpu")
    monkeypatch.setenv("PCFLOW_OFFERED_PROFILES", "aws-gpu,local")
    assert alerting_profile({"profile": named}) == "aws-gpu"
    assert alerting_profile({"profile": "local"}) == "local"
    monkeypatch.setenv("PCFLOW_OFFERED_PROFILES", "aws-gpu,nowhere")  # a wrong setting: the default still alerts
    assert alerting_profile({"profile": "local"}) == "aws-gpu"


@pytest.mark.parametrize(
    ("on_run_failure", "kind", "unattended", "alerts_it"),
    [
        ("unattended", alerts.CLEANUP, False, True),  # pretrain's teardown: what it left keeps billing
        ("none", alerts.CLEANUP, False, True),  # a cleanup alerts whatever the profile says
        ("unattended", alerts.RUN, True, True),  # the nightly, the janitor
        ("unattended", alerts.RUN, False, False),  # pretrain: the person who started it sees it
        ("all", alerts.RUN, False, True),
        ("none", alerts.RUN, True, False),
        ("unattended", alerts.APPROVAL, False, False),  # on_approval_timeout off
    ],
)
def test_which_failures_alert(on_run_failure, kind, unattended, alerts_it):
    settings = AlertsSettings(sns_topic_arn=TOPIC, on_run_failure=on_run_failure)
    assert alerts.should_alert(settings, kind, unattended=unattended) is alerts_it


def test_an_unanswered_approval_alerts_where_the_profile_asks():
    from airflow.providers.standard.exceptions import HITLTimeoutError

    kind = alerts.failure_kind(None, HITLTimeoutError({"error_type": "timeout"}))
    assert kind == alerts.APPROVAL
    asks = AlertsSettings(sns_topic_arn=TOPIC, on_run_failure="none", on_approval_timeout=True)
    assert alerts.should_alert(asks, kind, unattended=False)
    late = alerts.Failure("pretrain", "manual__x", "approve_cost", "HITLTimeoutError: x", "k", "research", kind=kind)
    assert alert_subject(late) == "pcflow: pretrain approval not answered at approve_cost (stack research)"


def test_a_cleanup_is_a_teardown_task_or_a_teardown_operator_and_a_dag_on_a_schedule_is_unattended():
    from airflow.sdk import DAG, Asset
    from airflow.sdk.bases.operator import BaseOperator

    from pcflow.aws.janitor import JanitorOperator

    with DAG("kinds", schedule=None) as manual:
        setup, work, cleanup = BaseOperator(task_id="s"), BaseOperator(task_id="w"), BaseOperator(task_id="c")
        setup >> work >> cleanup.as_teardown(setups=setup)
    kinds = [alerts.failure_kind(task, RuntimeError("x")) for task in (setup, work, cleanup)]
    assert kinds == [alerts.RUN, alerts.RUN, alerts.CLEANUP]
    assert alerts.failure_kind(JanitorOperator(task_id="reap"), RuntimeError("x")) == alerts.CLEANUP
    assert not alerts.runs_unattended(manual) and not alerts.runs_unattended(None)
    assert alerts.runs_unattended(DAG("hourly", schedule="@hourly"))
    assert alerts.runs_unattended(DAG("on_data", schedule=[Asset("pcflow-dataset-x")]))


def incomplete(*remaining: Resource, held: tuple[Resource, ...] = (), errors=None):
    from pcflow.aws.teardown import TeardownIncomplete, TeardownReport

    report = TeardownReport(dry_run=False, remaining=list(remaining), errors=errors or {}, held=list(held))
    report.hold_reasons = ["fs-1: its export to S3 failed"] if held else []
    return TeardownIncomplete(report)


def test_a_failed_teardown_names_what_it_left_without_secrets_and_bounded():
    from airflow.sdk.log import mask_secret

    mask_secret("sekrit-session-token-42")
    vpc, sg = Resource("vpc", "vpc-1", TAGS, "available"), Resource("security-group", "sg-1", TAGS)
    errors = {vpc.key: "DependencyViolation: in use", sg.key: "AuthFailure: token sekrit-session-token-42 " + "x" * 500}
    lines = alerts.not_deleted(incomplete(vpc, sg, held=(Resource("fsx", "fs-1", TAGS),), errors=errors))
    assert lines[0] == "vpc vpc-1 (available): DependencyViolation: in use"
    assert lines[1].startswith("security-group sg-1: AuthFailure: token *** xxx") and lines[1].endswith(" ...")
    assert len(lines[1]) <= alerts.MAX_LINE_CHARS + 4
    assert lines[2] == "fsx fs-1: kept with what it belongs to (fs-1: its export to S3 failed)"
    assert alerts.not_deleted(RuntimeError("no report")) == [] and alerts.not_deleted(None) == []

    many = alerts.not_deleted(incomplete(*(Resource("image", f"ami-{i}", TAGS) for i in range(MAX_LISTED + 3))))
    left = alerts.Failure("pretrain", "r", "teardown", "TeardownIncomplete: 15", "k", "research", kind=alerts.CLEANUP)
    message = alert_message(dataclasses.replace(left, not_deleted=many), LeftRunning())
    assert "It is a cleanup: what it deletes may still be there, and billing." in message
    assert message.count("  image ami-") == MAX_LISTED and "... and 3 more (the task's log has them all)" in message
    assert alert_subject(left) == "pcflow: pretrain cleanup failed at teardown (stack research)"


class Published:
    """The provider's notifier, recording what it was asked to publish instead of publishing."""

    sent: ClassVar[list[dict]] = []

    def __init__(self, **kwargs):
        self.kwargs = kwargs

    def notify(self, context):
        Published.sent.append(self.kwargs)


@pytest.mark.parametrize(("on_run_failure", "sent"), [("unattended", 0), ("all", 1)])
def test_a_failed_run_a_person_started_alerts_only_where_the_profile_asks(
    admin_profiles, monkeypatch, on_run_failure, sent
):
    from airflow.sdk import DAG
    from airflow.sdk.bases.operator import BaseOperator

    monkeypatch.setattr("airflow.providers.amazon.aws.notifications.sns.SnsNotifier", Published)
    monkeypatch.setattr(Published, "sent", [])
    monkeypatch.setattr(alerts, "left_running", lambda *args: LeftRunning())
    monkeypatch.setattr(FailureAlert, "lookup_clients", lambda self, region: None)
    profile = admin_profiles.make("local", {"alerts": {"sns_topic_arn": TOPIC, "on_run_failure": on_run_failure}})
    with DAG("pretrain", schedule=None) as dag:
        task = BaseOperator(task_id="train")

    class TI:
        dag_id, run_id, task_id, map_index, try_number = "pretrain", "manual__x", "train", -1, 1

        def xcom_pull(self, task_ids):
            return None

    context = {"params": {"profile": profile}, "dag": dag, "task": task, "ti": TI(), "exception": RuntimeError("x")}
    FailureAlert().notify(context)
    assert len(Published.sent) == sent
    if sent:
        assert Published.sent[0]["message_attributes"]["kind"] == "run"


def test_which_failures_alert_is_the_admin_s():
    for setting in ({"on_run_failure": "none"}, {"on_approval_timeout": True}):
        with pytest.raises(RunSpecError, match=r"alerts\.on_.*: only the deployment admin may change this"):
            check_conf("local", {"alerts": setting})
    with pytest.raises(ValueError, match="on_run_failure"):
        AlertsSettings(on_run_failure="sometimes")
