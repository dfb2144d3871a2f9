"""include/local/iam_calls.py and pcflow.aws.calllog: recorded AWS calls judged against the shipped IAM
policies, as the rehearsal judges every call it makes (tests/dags/test_rehearsal.py runs it for real).

A call its caller's policy does not allow is reported denied; the pcluster CLI's creation of a cluster
whose stack holds an FSx for Lustre file system needs the FSx service-linked role on first use, which
moto does not model: the judge adds it, as the FSx user guide says CreateFileSystem needs it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import iam_calls
import pytest
from dagrun import REPO
from iam_calls import evaluate, read_calls, requests_for

from pcflow.aws.calllog import recording

STACK_TAGS = [{"Key": "pcflow:stack", "Value": "research"}]
FSX_TEMPLATE = {
    "Resources": {
        "FSx0": {
            "Type": "AWS::FSx::FileSystem",
            "Properties": {"FileSystemType": "LUSTRE", "LustreConfiguration": {"ImportPath": "s3://my-pcflow-data/x"}},
        }
    }
}


def call(caller: str, service: str, operation: str, params: dict) -> dict:
    return {"caller": caller, "service": service, "operation": operation, "region": "us-east-1", "params": params}


CREATE_CLUSTER = call(
    "pcluster",
    "cloudformation",
    "CreateStack",
    {"StackName": "pcflow-research-cluster", "TemplateBody": json.dumps(FSX_TEMPLATE), "Tags": STACK_TAGS},
)


def policies_without(sid: str, tmp_path: Path) -> dict[str, Path]:
    """The shipped policies, the pcluster CLI's without statement `sid`."""
    policy = json.loads(iam_calls.POLICY_OF["pcluster"].read_text())
    policy["Statement"] = [s for s in policy["Statement"] if s.get("Sid") != sid]
    path = tmp_path / "pcluster-cli-policy.json"
    path.write_text(json.dumps(policy))
    return {**iam_calls.POLICY_OF, "pcluster": path}


def test_creating_an_fsx_cluster_needs_the_service_linked_roles():
    wanted = {r.action: r for r in requests_for(CREATE_CLUSTER, {})}
    assert {"cloudformation:CreateStack", "fsx:CreateFileSystem", "iam:CreateServiceLinkedRole"} <= set(wanted)
    roles = {r.resource for r in requests_for(CREATE_CLUSTER, {}) if r.action == "iam:CreateServiceLinkedRole"}
    assert {role.split("/")[2] for role in roles} == {"fsx.amazonaws.com", "s3.data-source.lustre.fsx.amazonaws.com"}


def test_the_pcluster_policy_allows_creating_an_fsx_cluster():
    assert evaluate([CREATE_CLUSTER]) == {"calls": 1, "denied": 0}


def test_a_call_the_policy_does_not_allow_is_reported_denied(tmp_path):
    """The policy as it was before it granted the service-linked roles: the creation is denied, and why."""
    judged = evaluate([CREATE_CLUSTER], policies_without("ServiceLinkedRolesOnFirstUse", tmp_path))
    assert judged["denied"] == 1
    assert all(d.startswith("pcluster: iam:CreateServiceLinkedRole on ") for d in judged["denials"]), judged


def test_resource_tags_come_from_the_run_s_answers():
    """A delete is allowed on what the run saw tagged as pcflow's, refused on anything else; a subnet
    association is judged on its route table."""
    seen = {"rtb-1": {"pcflow:stack": "research"}, iam_calls.OWNERS: {"rtbassoc-1": "rtb-1"}}
    calls = [
        call("airflow", "ec2", "DeleteRouteTable", {"RouteTableId": "rtb-1"}),
        call("airflow", "ec2", "DisassociateRouteTable", {"AssociationId": "rtbassoc-1"}),
        call("airflow", "ec2", "DeleteRouteTable", {"RouteTableId": "rtb-someone-elses"}),
    ]
    calls[0]["tags"] = {k: v for k, v in seen.items() if k != iam_calls.OWNERS}
    calls[0]["owners"] = seen[iam_calls.OWNERS]
    judged = evaluate(calls)
    assert judged["denied"] == 1 and "rtb-someone-elses" in judged["denials"][0], judged


def test_s3_operations_are_judged_as_their_actions_on_buckets_and_objects():
    head = requests_for(call("airflow", "s3", "HeadObject", {"Bucket": "b-pcflow", "Key": "k"}), {})
    listing = requests_for(call("airflow", "s3", "ListObjectsV2", {"Bucket": "b-pcflow"}), {})
    assert [(r.action, r.resource) for r in head + listing] == [
        ("s3:GetObject", "arn:aws:s3:::b-pcflow/k"),
        ("s3:ListBucket", "arn:aws:s3:::b-pcflow"),
    ]


RECORD = """
import boto3
from botocore.stub import Stubber
sts = boto3.client("sts", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
with Stubber(sts) as stub:
    stub.add_response("get_caller_identity", {"Account": "123456789012", "Arn": "arn:aws:iam::123456789012:user/x"})
    sts.get_caller_identity()
"""


@pytest.mark.parametrize("python", [".venv/bin/python", ".venv-pcluster/bin/python"])
def test_every_client_of_a_child_process_is_recorded(python, tmp_path):
    """pcflow's environment and the pcluster CLI's (no pcflow installed there) both log through the
    botocore plugin the recording names, with the caller the environment says."""
    interpreter = REPO / python
    if not interpreter.exists():
        pytest.skip(f"{python} is not installed (make pcluster)")
    with recording(tmp_path / "calls.jsonl") as log:
        env = {**os.environ, "PCFLOW_AWS_CALLER": "pcluster"}
        subprocess.run([str(interpreter), "-c", RECORD], env=env, check=True, cwd=tmp_path)
    assert "PCFLOW_AWS_CALL_LOG" not in os.environ
    [recorded] = read_calls(log)
    assert (recorded["caller"], recorded["service"], recorded["operation"]) == ("pcluster", "sts", "GetCallerIdentity")
