"""Throttling: the moto server never throttles, so throttling responses are injected in botocore's
`before-send` hook (the request never reaches the server); the stage still succeeds because every
pcflow client runs botocore's standard retry mode."""

from __future__ import annotations

from collections import Counter

import pytest
from botocore.awsrequest import AWSResponse

from pcflow.aws.clients import aws_client
from pcflow.aws.network import ensure_network
from pcflow.aws.network_spec import NetworkSpec

pytestmark = pytest.mark.stack

EC2_THROTTLE = (
    b'<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>RequestLimitExceeded</Code>'
    b"<Message>Request limit exceeded.</Message></Error></Errors><RequestID>x</RequestID></Response>"
)


def throttle_first(client, operations: dict[str, int], body: bytes, status: int) -> Counter:
    """Answer the first N calls of each named operation with a throttling error."""
    injected: Counter = Counter()

    def before_send(request, event_name, **_):
        operation = event_name.rsplit(".", 1)[-1]
        if injected[operation] < operations.get(operation, 0):
            injected[operation] += 1
            return AWSResponse(request.url, status, {"Content-Type": "text/xml"}, _Raw(body))
        return None

    client.meta.events.register("before-send", before_send)
    return injected


class _Raw:
    def __init__(self, body: bytes):
        self.body = body

    def stream(self, **_):
        yield self.body

    def read(self, *_):
        return self.body


def test_ensure_network_survives_request_limit_exceeded(local_stack, aws, stack, counts):
    ec2 = aws_client("ec2", aws_conn_id="aws_default")  # own client: the hook stays off the shared one
    plan = {"CreateVpc": 2, "CreateSubnet": 1, "DescribeVpcs": 2, "AuthorizeSecurityGroupIngress": 1}
    injected = throttle_first(ec2, plan, EC2_THROTTLE, 503)
    ids = ensure_network(ec2, NetworkSpec(stack=stack, region="us-east-1"), waiter_delay=0)
    assert dict(injected) == plan
    assert ids.vpc_id and counts()["vpc"] == 1 and counts()["subnet"] == 1


def test_s3_throttling_exception_is_retried(local_stack, aws):
    import uuid

    from pcflow.aws.storage import ensure_bucket

    s3 = aws_client("s3", aws_conn_id="aws_default")
    body = b"<Error><Code>ThrottlingException</Code><Message>Rate exceeded</Message></Error>"
    injected = throttle_first(s3, {"CreateBucket": 2, "PutPublicAccessBlock": 1}, body, 400)
    name = f"pcflow-throttle-{uuid.uuid4().hex[:10]}"
    try:
        ensure_bucket(s3, name, region="us-east-1", tags={"pcflow:stack": "throttle"})
        assert injected["CreateBucket"] == 2 and injected["PutPublicAccessBlock"] == 1
        assert s3.get_public_access_block(Bucket=name)["PublicAccessBlockConfiguration"]["BlockPublicAcls"]
    finally:
        s3.delete_bucket(Bucket=name)


def test_without_standard_mode_the_same_throttling_fails():
    """Control: the retry mode is what makes the difference (a client with retries off fails)."""
    from botocore.exceptions import ClientError

    ec2 = aws_client(
        "ec2", aws_conn_id="aws_default", botocore_config={"retries": {"mode": "standard", "total_max_attempts": 1}}
    )
    throttle_first(ec2, {"DescribeVpcs": 1}, EC2_THROTTLE, 503)
    with pytest.raises(ClientError, match="RequestLimitExceeded"):
        ec2.describe_vpcs()
