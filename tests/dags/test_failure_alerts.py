"""A failing run of each DAG alerts a person, once: its failed task publishes, through the Amazon provider's
SNS notifier, to the topic of the admin's profile on the moto server, and the message arrives in an SQS
queue subscribed to it, naming the stage, why, the run and what is still there. The nightly fails in its
first task (a conf the profile refuses), so nothing is created. `pretrain`, `pretrain_sweep` and the
janitor fail in a cleanup: a network with a subnet nobody tagged in it, which AWS (and moto) refuses to
delete; the pipelines run only their first task and `teardown` (the others marked done). About 15 s each
with the stack up."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from unittest import mock

import boto3
import pytest
from dagrun import REPO, run_dag

from pcflow.alerts import FailureAlert
from pcflow.naming import run_key
from pcflow.pipeline import TRAINING_DAG_ARGS

pytestmark = pytest.mark.stack
STACK = "alerts"
NOT_DELETED = "Not deleted (the teardown's report):"


@pytest.fixture
def subscribed_queue(local_stack):
    """A topic named as the IAM policy allows (pcflow-alerts*) and an SQS queue subscribed to it."""
    sns, sqs = boto3.client("sns"), boto3.client("sqs")
    name = f"pcflow-alerts-{uuid.uuid4().hex[:8]}"
    topic = sns.create_topic(Name=name)["TopicArn"]
    queue = sqs.create_queue(QueueName=name)["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn)
    yield topic, queue
    sqs.delete_queue(QueueUrl=queue)
    sns.delete_topic(TopicArn=topic)


@pytest.fixture
def kept_network(local_stack):
    """What an earlier night of the stack keeps (its network), tagged as the network stage tags it."""
    ec2 = boto3.client("ec2")
    tags = [{"Key": "pcflow:stack", "Value": STACK}, {"Key": "pcflow:expires", "Value": "2099-01-01T00:00:00Z"}]
    vpc = ec2.create_vpc(CidrBlock="10.77.0.0/16", TagSpecifications=[{"ResourceType": "vpc", "Tags": tags}])["Vpc"]
    yield vpc["VpcId"]
    ec2.delete_vpc(VpcId=vpc["VpcId"])


@pytest.fixture
def stuck_network(local_stack):
    """`make(tags)`: a VPC with those tags and a subnet in it that nobody tagged, so no teardown lists it
    and DeleteVpc answers DependencyViolation, as AWS does while a subnet is left in a VPC."""
    ec2, made = boto3.client("ec2"), []

    def make(tags: dict[str, str]) -> str:
        spec = [{"ResourceType": "vpc", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]
        vpc = ec2.create_vpc(CidrBlock="10.78.0.0/16", TagSpecifications=spec)["Vpc"]["VpcId"]
        made.append((vpc, ec2.create_subnet(VpcId=vpc, CidrBlock="10.78.0.0/24")["Subnet"]["SubnetId"]))
        return vpc

    yield make
    for vpc, subnet in made:
        ec2.delete_subnet(SubnetId=subnet)
        ec2.delete_vpc(VpcId=vpc)


@pytest.fixture
def no_retries():
    """The pipelines' tasks fail at their first try: a cleanup that fails for good would only give
    Airflow's retries (after 20 s and 40 s) the same answer, and the notifier runs after the last."""
    with mock.patch.dict(TRAINING_DAG_ARGS["default_args"], {"retries": 0}):
        yield


def received(queue: str) -> list[dict]:
    """Every message the queue holds (SNS delivers to SQS before Publish returns on moto; one wait)."""
    sqs = boto3.client("sqs")
    messages = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=5).get("Messages", [])
    return [json.loads(m["Body"]) for m in messages]


def attributes_of(envelope: dict) -> dict[str, str]:
    return {k: v["Value"] for k, v in envelope["MessageAttributes"].items()}


@pytest.mark.usefixtures("airflow")
def test_a_failing_nightly_publishes_its_stage_reason_and_what_is_left(
    admin_profiles, subscribed_queue, kept_network, artifacts_dir
):
    topic, queue = subscribed_queue
    profile = admin_profiles.make("local", {"stack": STACK, "alerts": {"sns_topic_arn": topic}})

    result = run_dag("pretrain_nightly", {"profile": profile, "nodes": 9})  # the profile allows 1-3

    assert result.state == "failed" and result.task_states["validate"] == "failed"
    [envelope] = received(queue)  # one failed stage, one message
    assert envelope["TopicArn"] == topic
    assert envelope["Subject"] == f"pcflow: pretrain_nightly failed at validate (stack {STACK})"
    assert attributes_of(envelope) == {
        "dag_id": "pretrain_nightly",
        "task_id": "validate",
        "stack": STACK,
        "kind": "run",
    }
    message = envelope["Message"]
    (artifacts_dir / "alert.txt").write_text(f"Subject: {envelope['Subject']}\n\n{message}\n")
    assert "pcflow: pretrain_nightly failed at stage validate (try 1)." in message
    assert "Why: RunSpecError: settings a trigger user may not change:" in message
    assert "training.nodes (form field 'nodes'): 9 is outside" in message
    assert f"(run key {run_key('pretrain_nightly', result.run_id)}, stack {STACK})" in message
    assert f"Still there (stack {STACK} in us-east-1;" in message
    assert f"vpc {kept_network} (available), stack {STACK}, expires 2099-01-01T00:00:00Z: $0.00/day (free)" in message


@pytest.mark.parametrize("dag_id", ["pretrain", "pretrain_sweep"])
@pytest.mark.usefixtures("airflow", "no_retries")
def test_a_failed_teardown_alerts_also_in_a_dag_a_person_started(
    dag_id, admin_profiles, subscribed_queue, stuck_network, artifacts_dir
):
    topic, queue = subscribed_queue
    profile = admin_profiles.make("local", {"stack": STACK, "alerts": {"sns_topic_arn": topic}})
    when = dt.datetime.now(dt.UTC)
    key = run_key(dag_id, f"manual__{when.isoformat()}")
    vpc = stuck_network({"pcflow:stack": STACK, "pcflow:run": key, "pcflow:expires": "2099-01-01T00:00:00Z"})

    result = run_dag(dag_id, {"profile": profile}, logical_date=when, run_after=when, only=("validate", "teardown"))

    assert result.run_key == key and result.task_states["teardown"] == "failed", result.task_states
    [envelope] = received(queue)  # the cleanup's failure, and only it
    assert envelope["Subject"] == f"pcflow: {dag_id} cleanup failed at teardown (stack {STACK})"
    assert attributes_of(envelope) == {"dag_id": dag_id, "task_id": "teardown", "stack": STACK, "kind": "cleanup"}
    message = envelope["Message"]
    (artifacts_dir / "alert.txt").write_text(f"Subject: {envelope['Subject']}\n\n{message}\n")
    assert "It is a cleanup: what it deletes may still be there, and billing." in message
    assert "Why: TeardownIncomplete: 1 resource(s) not deleted, listed below" in message
    assert f"{NOT_DELETED}\n  vpc {vpc} (available): DependencyViolation: " in message
    assert f"vpc {vpc} (available), stack {STACK}, run {key}, expires 2099-01-01T00:00:00Z" in message


@pytest.mark.usefixtures("airflow")
def test_a_failed_reap_alerts_the_default_profile_s_topic(admin_profiles, subscribed_queue, stuck_network, monkeypatch):
    topic, queue = subscribed_queue
    monkeypatch.setenv("PCFLOW_DEFAULT_PROFILE", admin_profiles.make("local", {"alerts": {"sns_topic_arn": topic}}))
    vpc = stuck_network({"pcflow:stack": STACK, "pcflow:expires": "2000-01-01T00:00:00Z"})  # long expired

    result = run_dag("janitor", {"dry_run": False}, only=("reap",))  # the other task is marked done

    assert result.task_states["reap"] == "failed", result.task_states
    [envelope] = received(queue)
    assert envelope["Subject"] == "pcflow: janitor cleanup failed at reap"
    assert attributes_of(envelope) == {"dag_id": "janitor", "task_id": "reap", "stack": "*", "kind": "cleanup"}
    assert (
        f"Not deleted (the teardown's report):\n  vpc {vpc} (available): DependencyViolation: " in envelope["Message"]
    )


def test_every_task_of_every_dag_carries_one_notifier():
    """One notifier a task (none on a DAG: one message a failure), deciding when it runs whether the
    failure alerts; the janitor's lists every stack. A pipeline's cleanups carry their own, so they
    alert in a task group of someone else's DAG too."""
    from airflow.dag_processing.dagbag import DagBag

    dags = DagBag(dag_folder=str(REPO / "dags")).dags
    for dag_id in ("pretrain", "pretrain_nightly", "pretrain_sweep", "janitor"):
        dag = dags[dag_id]
        callbacks = [task.on_failure_callback for task in dag.tasks]  # a list per task
        assert callbacks and all(len(c) == 1 and isinstance(c[0], FailureAlert) for c in callbacks), dag_id
        assert {c[0].every_stack for c in callbacks} == {dag_id == "janitor"}, dag_id
        assert not dag.on_failure_callback, dag_id

    from airflow.sdk import DAG

    from pcflow.pipeline import training_params, training_pipeline_group

    with DAG("someone_else", schedule=None, params=training_params()) as theirs:
        training_pipeline_group()
    alerting = {t.task_id for t in theirs.tasks if any(isinstance(c, FailureAlert) for c in t.on_failure_callback)}
    assert alerting == {"training.delete_cluster", "training.teardown", "training.release_network"}
