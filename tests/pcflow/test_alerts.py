"""The failure alert's text and its parts, offline: the subject SNS accepts, the reason bounded and without
known secrets, what is still there listed with its cost per day and bounded (a failed or slow lookup
becomes a line of the message, not a failed alert), the topic read from the admin's profile only.
About a second."""

from __future__ import annotations

import time

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
