"""A failing nightly alerts a person: its failed stage publishes, through the Amazon provider's SNS notifier,
to the topic of the admin's profile on the moto server, and the message arrives in an SQS queue
subscribed to it, naming the stage, why, the run and what its stack still keeps. The nightly fails in its
first task (a conf the profile refuses), so nothing is created: about 15 s with the stack up."""

from __future__ import annotations

import json
import uuid

import boto3
import pytest
from dagrun import REPO, run_dag

from pcflow.alerts import FailureAlert
from pcflow.naming import run_key

pytestmark = pytest.mark.stack
STACK = "alerts"


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


def received(queue: str) -> list[dict]:
    sqs = boto3.client("sqs")
    messages = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=5).get("Messages", [])
    return [json.loads(m["Body"]) for m in messages]


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
    attributes = {k: v["Value"] for k, v in envelope["MessageAttributes"].items()}
    assert attributes == {"dag_id": "pretrain_nightly", "task_id": "validate", "stack": STACK}
    message = envelope["Message"]
    (artifacts_dir / "alert.txt").write_text(f"Subject: {envelope['Subject']}\n\n{message}\n")
    assert "pcflow: pretrain_nightly failed at stage validate (try 1)." in message
    assert "Why: AirflowFailException: settings a trigger user may not change:" in message
    assert "training.nodes (form field 'nodes'): 9 is outside" in message
    assert f"(run key {run_key('pretrain_nightly', result.run_id)}, stack {STACK})" in message
    assert f"Still there (stack {STACK} in us-east-1;" in message
    assert f"vpc {kept_network} (available), stack {STACK}, expires 2099-01-01T00:00:00Z: $0.00/day (free)" in message


def test_the_nightly_and_the_janitor_alert_and_pretrain_does_not():
    """Every task of the two DAGs carries the notifier (the janitor's lists every stack); a by-hand run
    of `pretrain` tears itself down and is watched by the person who started it."""
    from airflow.dag_processing.dagbag import DagBag

    dags = DagBag(dag_folder=str(REPO / "dags")).dags
    for dag_id, every_stack in (("pretrain_nightly", False), ("janitor", True)):
        callbacks = [task.on_failure_callback for task in dags[dag_id].tasks]  # a list per task
        assert callbacks and all(len(c) == 1 and isinstance(c[0], FailureAlert) for c in callbacks), dag_id
        assert {c[0].every_stack for c in callbacks} == {every_stack}, dag_id
    assert not any(task.on_failure_callback for task in dags["pretrain"].tasks)
