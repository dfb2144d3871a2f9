"""The Airflow role's IAM policy (include/iam/pcflow-airflow-policy.json) against the AWS calls pcflow's
code makes: every call allowed, every allowed action called, no wildcard actions.

The calls are read from plugins/pcflow's syntax tree, not from a hand-kept list: a method call or a
string (paginators, waiters, teardown's operation tables) whose name is an operation of a service pcflow
makes a client for, in botocore's service model; waiter names are mapped to the operation they poll.
Operations become IAM actions by name, except S3's, whose actions are named differently (AWS's S3 user
guide, "Required permissions for Amazon S3 API operations"): include/local/iam_calls.py's mapping, which
the rehearsal also judges every call it records with.
"""

from __future__ import annotations

import ast
import json
from collections import defaultdict
from functools import cache
from pathlib import Path

import botocore.session
import iam_calls  # include/local: the evaluator and the operation -> action mapping, shared with the rehearsal
import pytest
from botocore import xform_name

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "plugins" / "pcflow"
AIRFLOW_POLICY = REPO / "include" / "iam" / "pcflow-airflow-policy.json"
PCLUSTER_POLICY = REPO / "include" / "iam" / "pcluster-cli-policy.json"

#: The Amazon provider's hooks pcflow uses, and the client each makes.
PROVIDER_HOOKS = {"EC2Hook": "ec2", "S3Hook": "s3", "CloudFormationHook": "cloudformation"}
#: The services pcflow calls (a new service fails the test until it is added here).
PCFLOW_SERVICES = {
    "ec2",
    "s3",
    "ssm",
    "fsx",
    "cloudwatch",
    "cloudformation",
    "sts",
    "iam",
    "sns",
    "service-quotas",
    "pricing",
    "ecr",  # a run's container image: its digest and a pull token (pcflow.aws.ecr)
}
#: What s3transfer's TransferManager calls for an upload (multipart above its threshold, abort on failure).
TRANSFER_MANAGER_CALLS = {
    ("s3", op) for op in ("PutObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload")
} | {("s3", "AbortMultipartUpload")}
#: Provider classes that make AWS calls themselves, and the calls: the failure alert's notifier publishes.
PROVIDER_CALLS = {
    "SnsNotifier": {("sns", "Publish")},
    # enroot pulls a run's image on the head node with the token GetAuthorizationToken issued to pcflow's
    # credentials (pcflow.slurm.images.import_sqsh): what a registry pull calls, on those credentials.
    "enroot_import_argv": {("ecr", "BatchCheckLayerAvailability"), ("ecr", "GetDownloadUrlForLayer")},
}
#: Method names that are AWS operations but are called on something else here.
NOT_AWS_CALLS = {"get_template": "jinja2.Environment.get_template (report and batch templates)"}
#: Operation names two services share: the one pcflow calls.
SHARED_NAMES = {"delete_snapshot": "ec2", "describe_snapshots": "ec2", "describe_images": "ec2"}


@cache
def session() -> botocore.session.Session:
    return botocore.session.get_session()


class Code:
    """What plugins/pcflow's syntax trees name: called methods, string constants, keyword/dict keys."""

    def __init__(self) -> None:
        self.methods: set[str] = set()
        self.strings: set[str] = set()
        self.parameters: set[str] = set()
        self.names: set[str] = set()
        self.client_services: set[str] = set()
        for source in sorted(PLUGINS.rglob("*.py")):
            for node in ast.walk(ast.parse(source.read_text(), str(source))):
                self.visit(node)
        self.client_services |= {service for hook, service in PROVIDER_HOOKS.items() if hook in self.names}

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if isinstance(func, ast.Attribute):
                self.methods.add(func.attr)
            first = node.args[0] if node.args else None
            if name in ("client", "clients", "aws_client", "client_from_hook") and isinstance(first, ast.Constant):
                self.client_services.add(first.value)
            for keyword in node.keywords:
                if keyword.arg:
                    self.parameters.add(keyword.arg)
                if keyword.arg == "client_type" and isinstance(keyword.value, ast.Constant):
                    self.client_services.add(keyword.value.value)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:  # kwargs["client_type"] = "fsx"
                if isinstance(target, ast.Subscript) and getattr(target.slice, "value", None) == "client_type":
                    self.client_services.add(node.value.value)
        elif isinstance(node, ast.Dict):
            self.parameters |= {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            self.strings.add(node.value)
        elif isinstance(node, ast.Name):
            self.names.add(node.id)
        elif isinstance(node, ast.alias):
            self.names.add(node.asname or node.name)


@cache
def code() -> Code:
    return Code()


def operations(services: set[str]) -> dict[str, set[tuple[str, str]]]:
    """snake_case method name -> (service, Operation) for every operation of `services`."""
    found = defaultdict(set)
    for service in services:
        for operation in session().get_service_model(service).operation_names:
            found[xform_name(operation)].add((service, operation))
    return found


def waiters(services: set[str]) -> dict[str, tuple[str, str]]:
    """Waiter name (botocore's snake_case, or a custom waiter file's) -> the operation it polls."""
    found = {}
    for service in services:
        try:
            model = session().get_waiter_model(service)
        except Exception:  # the service has no waiters
            continue
        for name in model.waiter_names:
            found[xform_name(name)] = (service, model.get_waiter(name).operation)
    for path in PLUGINS.rglob("waiters/*.json"):  # custom waiters of pcflow's hooks (FsxHook)
        for name, waiter in json.loads(path.read_text())["waiters"].items():
            found[name] = (path.stem, waiter["operation"])
    return found


def called_operations() -> set[tuple[str, str]]:
    found = code()
    services = found.client_services
    by_name = operations(services)
    calls: set[tuple[str, str]] = set()
    for name in (found.methods | found.strings) & by_name.keys():
        if name in NOT_AWS_CALLS:
            continue
        candidates = by_name[name]
        if len(candidates) > 1:
            assert name in SHARED_NAMES, f"{name} is an operation of {sorted(candidates)}: say which in SHARED_NAMES"
            candidates = {c for c in candidates if c[0] == SHARED_NAMES[name]}
        calls |= candidates
    calls |= {op for name, op in waiters(services).items() if name in found.strings}
    if "TransferManager" in found.names:
        calls |= TRANSFER_MANAGER_CALLS
    for provider_class, provider_calls in PROVIDER_CALLS.items():
        if provider_class in found.names:
            calls |= provider_calls
    return calls


def iam_action(service: str, operation: str) -> str:
    assert service in PCFLOW_SERVICES, f"pcflow calls {service}: add it to PCFLOW_SERVICES (its prefix to IAM_PREFIX)"
    return iam_calls.iam_action(service, operation)


def needed_actions() -> set[str]:
    calls = called_operations()
    needed = {iam_action(*call) for call in calls}
    for ((service, operation), parameter), action in iam_calls.PARAMETER_ACTIONS.items():
        if parameter in code().parameters and any(s == service and operation in ("*", o) for s, o in calls):
            needed.add(action)
    return needed


def policy_actions(path: Path) -> list[str]:
    actions = []
    for statement in json.loads(path.read_text())["Statement"]:
        assert statement["Effect"] == "Allow" and statement["Resource"], (path.name, statement)
        action = statement["Action"]
        actions += [action] if isinstance(action, str) else action
    return actions


def test_the_scan_finds_pcflow_s_clients_and_calls():
    found = code()
    assert {"ec2", "s3", "ssm", "fsx", "cloudwatch", "cloudformation"} <= found.client_services
    calls = called_operations()
    # One of each kind of evidence: a method call, a paginator, a waiter, a teardown table, s3transfer.
    for call in (
        ("ec2", "CreateVpc"),
        ("ec2", "DescribeSpotPriceHistory"),
        ("pricing", "GetProducts"),
        ("fsx", "DescribeDataRepositoryTasks"),
        ("cloudformation", "DescribeStacks"),
        ("s3", "AbortMultipartUpload"),
        ("sns", "Publish"),
    ):
        assert call in calls, call
    # The exception tables name only what the code still contains.
    assert set(NOT_AWS_CALLS) <= found.methods
    assert set(SHARED_NAMES) <= found.methods | found.strings


def test_airflow_policy_allows_every_aws_call_pcflow_makes():
    allowed = set(policy_actions(AIRFLOW_POLICY))
    missing = sorted(needed_actions() - allowed)
    assert not missing, f"called by plugins/pcflow but not allowed by {AIRFLOW_POLICY.name}: {missing}"


def test_airflow_policy_allows_nothing_pcflow_does_not_call():
    actions = policy_actions(AIRFLOW_POLICY)
    wildcards = [a for a in actions if "*" in a]
    assert not wildcards, f"wildcard actions in {AIRFLOW_POLICY.name}: {wildcards}"
    unused = sorted(set(actions) - needed_actions())
    assert not unused, f"allowed by {AIRFLOW_POLICY.name} but never called by plugins/pcflow: {unused}"


def test_pcluster_policy_has_no_service_wide_actions():
    """The pcluster CLI's policy follows ParallelCluster's documented base user policy (read-only
    Describe* included); it never grants a whole service."""
    actions = policy_actions(PCLUSTER_POLICY)
    assert not [a for a in actions if a == "*" or a.endswith(":*")], actions


# --- conditions, evaluated: allowed and refused requests through an IAM policy evaluator ---------------
#
# @cloud-copilot/iam-simulate (npm, pinned in tests/deploy/iam_simulate/package-lock.json, installed by
# `make iam-simulator`) evaluates a request the way AWS documents it: every condition operator, IfExists,
# Null, permissions boundaries, and it validates the action, the resource ARN and which condition keys the
# action supports (a key it would ignore fails the test below). Each conditioned statement of the two
# policies has at least one request it must allow and one it must refuse.

SIMULATOR = iam_calls.SIMULATOR
BOUNDARY_POLICY = REPO / "include" / "iam" / "pcflow-cluster-boundary.json"
NODE_POLICY = REPO / "include" / "iam" / "pcflow-cluster-node-policy.json"
NODE_POLICY_ARN = {"iam:PolicyARN": "arn:aws:iam::123456789012:policy/pcflow-cluster-node"}
ACCOUNT = "123456789012"
INSTANCE = f"arn:aws:ec2:us-east-1:{ACCOUNT}:instance/i-0123456789abcdef0"
BOUNDARY = f"arn:aws:iam::{ACCOUNT}:policy/pcflow-cluster-boundary"
CLUSTER_ROLE = f"arn:aws:iam::{ACCOUNT}:role/parallelcluster/pcflow-research-cluster/HeadNodeRole"
SHELL_DOCUMENT = f"arn:aws:ssm:us-east-1:{ACCOUNT}:document/AWS-RunShellScript"
BUILDER_TAGS = {"ssm:resourceTag/pcflow:component": "ami", "ssm:resourceTag/pcflow:role": "builder"}
OWN = {"aws:ResourceTag/pcflow:stack": "research"}

VPC = f"arn:aws:ec2:us-east-1:{ACCOUNT}:vpc/vpc-0123456789abcdef0"
OTHER_DOCUMENT = f"arn:aws:ssm:us-east-1:{ACCOUNT}:document/AnyOther"
HEAD_NODE_TAGS = {"ssm:resourceTag/pcflow:component": "cluster", "ssm:resourceTag/pcflow:role": "builder"}
TAGGED_CREATE = {"aws:RequestTag/pcflow:stack": "research", "aws:TagKeys": ["pcflow:stack"]}
OWN_STACK = f"arn:aws:cloudformation:us-east-1:{ACCOUNT}:stack/pcflow-research-cluster/1"
OTHER_STACK = f"arn:aws:cloudformation:us-east-1:{ACCOUNT}:stack/someone-else/1"
BUILDER_ROLE = f"arn:aws:iam::{ACCOUNT}:role/pcflow-ami-builder"
ADMIN_ROLE = f"arn:aws:iam::{ACCOUNT}:role/Admin"
TO_EC2 = {"iam:PassedToService": "ec2.amazonaws.com"}
TOPIC = f"arn:aws:sns:us-east-1:{ACCOUNT}"
BOUNDED = {"iam:PermissionsBoundary": BOUNDARY}
UNBOUNDED = {"iam:PermissionsBoundary": f"arn:aws:iam::{ACCOUNT}:policy/AnythingGoes"}
CLOUDWATCH_AGENT = {"iam:PolicyARN": "arn:aws:iam::aws:policy/CloudWatchAgentServerPolicy"}
ADMINISTRATOR = {"iam:PolicyARN": "arn:aws:iam::aws:policy/AdministratorAccess"}

#: (statement Sid, action, resource, context, allowed?) for include/iam/pcflow-airflow-policy.json.
AIRFLOW_REQUESTS = [
    ("BakeImageOnlyOnPcflowBuilders", "ssm:SendCommand", INSTANCE, BUILDER_TAGS, True),
    ("BakeImageOnlyOnPcflowBuilders", "ssm:SendCommand", INSTANCE, {}, False),  # any untagged instance
    ("BakeImageOnlyOnPcflowBuilders", "ssm:SendCommand", INSTANCE, HEAD_NODE_TAGS, False),  # a cluster's head node
    ("BakeImageWithTheShellDocument", "ssm:SendCommand", SHELL_DOCUMENT, {}, True),
    ("BakeImageWithTheShellDocument", "ssm:SendCommand", OTHER_DOCUMENT, {}, False),
    ("HeadNodeHostKeyFromOwnInstances", "ec2:GetConsoleOutput", INSTANCE, OWN, True),
    ("HeadNodeHostKeyFromOwnInstances", "ec2:GetConsoleOutput", INSTANCE, {}, False),
    ("CreateOnlyTaggedByPcflow", "ec2:CreateVpc", VPC, TAGGED_CREATE, True),
    ("CreateOnlyTaggedByPcflow", "ec2:CreateVpc", VPC, {}, False),
    ("TagOnCreateOnly", "ec2:CreateTags", VPC, {"ec2:CreateAction": "CreateVpc"}, True),
    ("TagOnCreateOnly", "ec2:CreateTags", VPC, {"ec2:CreateAction": "CreateKeyPair"}, False),
    # Moving an own resource's expiry on; not tagging someone's instance as pcflow's, nor moving an own
    # resource to another stack or run (only pcflow:expires and the DAG run that used it last may change).
    ("RetagOwnResources", "ec2:CreateTags", INSTANCE, {**OWN, "aws:TagKeys": ["pcflow:expires"]}, True),
    # ...and the DAG run that used it last, which the janitor asks Airflow about before deleting it.
    (
        "RetagOwnResources",
        "ec2:CreateTags",
        INSTANCE,
        {**OWN, "aws:TagKeys": ["pcflow:expires", "pcflow:dag-id", "pcflow:run-id"]},
        True,
    ),
    ("RetagOwnResources", "ec2:CreateTags", INSTANCE, {"aws:TagKeys": ["pcflow:expires"]}, False),
    ("RetagOwnResources", "ec2:CreateTags", INSTANCE, {**OWN, "aws:TagKeys": ["pcflow:stack"]}, False),
    ("RetagOwnResources", "ec2:CreateTags", INSTANCE, {**OWN, "aws:TagKeys": ["pcflow:expires", "pcflow:run"]}, False),
    ("ChangeAndDeleteOnlyPcflowTagged", "ec2:TerminateInstances", INSTANCE, OWN, True),
    ("ChangeAndDeleteOnlyPcflowTagged", "ec2:TerminateInstances", INSTANCE, {}, False),
    ("ClusterStacksTaggedByPcflow", "cloudformation:DeleteStack", OWN_STACK, OWN, True),
    ("ClusterStacksTaggedByPcflow", "cloudformation:DeleteStack", OTHER_STACK, {}, False),
    ("PassOnlyTheBuilderRole", "iam:PassRole", BUILDER_ROLE, TO_EC2, True),
    ("PassOnlyTheBuilderRole", "iam:PassRole", BUILDER_ROLE, {"iam:PassedToService": "lambda.amazonaws.com"}, False),
    ("PassOnlyTheBuilderRole", "iam:PassRole", ADMIN_ROLE, TO_EC2, False),
    ("TrainingMetricsAndDashboards", "cloudwatch:PutMetricData", "*", {"cloudwatch:namespace": "pcflow"}, True),
    ("TrainingMetricsAndDashboards", "cloudwatch:PutMetricData", "*", {"cloudwatch:namespace": "AWS/EC2"}, False),
    ("FailureAlertsToTheAdminsTopic", "sns:Publish", f"{TOPIC}:pcflow-alerts", {}, True),
    ("FailureAlertsToTheAdminsTopic", "sns:Publish", f"{TOPIC}:billing-team", {}, False),
]
#: The same for include/iam/pcluster-cli-policy.json (ParallelCluster's roles).
ROLES_BOUNDED = "ClusterRolesOnlyWithThePermissionsBoundary"
PASS_TO_EC2_AND_LAMBDA = "PassClusterRolesToEc2AndLambdaOnly"
VIA_STACK = {"aws:CalledViaFirst": "cloudformation.amazonaws.com"}
TO_CLOUDFORMATION = {"iam:PassedToService": "cloudformation.amazonaws.com"}
SERVICE_ROLES = f"arn:aws:iam::{ACCOUNT}:role/aws-service-role"
FSX_ROLE = f"{SERVICE_ROLES}/fsx.amazonaws.com/AWSServiceRoleForAmazonFSx"
FOR_FSX = {"iam:AWSServiceName": "fsx.amazonaws.com"}
SLR = "ServiceLinkedRolesOnFirstUse"
PCLUSTER_REQUESTS = [
    (SLR, "iam:CreateServiceLinkedRole", FSX_ROLE, FOR_FSX, True),
    (
        SLR,
        "iam:CreateServiceLinkedRole",
        f"{SERVICE_ROLES}/spot.amazonaws.com/AWSServiceRoleForEC2Spot",
        {"iam:AWSServiceName": "spot.amazonaws.com"},
        True,
    ),
    (SLR, "iam:CreateServiceLinkedRole", FSX_ROLE, {"iam:AWSServiceName": "organizations.amazonaws.com"}, False),
    (
        SLR,
        "iam:CreateServiceLinkedRole",
        f"{SERVICE_ROLES}/organizations.amazonaws.com/AWSServiceRoleForOrganizations",
        {"iam:AWSServiceName": "organizations.amazonaws.com"},
        False,
    ),
    (ROLES_BOUNDED, "iam:CreateRole", CLUSTER_ROLE, BOUNDED, True),
    (ROLES_BOUNDED, "iam:CreateRole", CLUSTER_ROLE, {}, False),
    (ROLES_BOUNDED, "iam:CreateRole", CLUSTER_ROLE, UNBOUNDED, False),
    (ROLES_BOUNDED, "iam:CreateRole", ADMIN_ROLE, BOUNDED, False),  # outside ParallelCluster's path
    (ROLES_BOUNDED, "iam:PutRolePolicy", CLUSTER_ROLE, {}, False),
    ("AttachOnlyAllowListedPolicies", "iam:AttachRolePolicy", CLUSTER_ROLE, {**BOUNDED, **CLOUDWATCH_AGENT}, True),
    ("AttachOnlyAllowListedPolicies", "iam:AttachRolePolicy", CLUSTER_ROLE, {**BOUNDED, **ADMINISTRATOR}, False),
    ("AttachOnlyAllowListedPolicies", "iam:AttachRolePolicy", CLUSTER_ROLE, CLOUDWATCH_AGENT, False),  # unbounded
    (PASS_TO_EC2_AND_LAMBDA, "iam:PassRole", CLUSTER_ROLE, TO_EC2, True),
    (PASS_TO_EC2_AND_LAMBDA, "iam:PassRole", CLUSTER_ROLE, TO_CLOUDFORMATION, False),
    (PASS_TO_EC2_AND_LAMBDA, "iam:PassRole", CLUSTER_ROLE, {}, False),
    ("WhatTheClusterStackCreates", "ec2:RunInstances", INSTANCE, VIA_STACK, True),
    ("WhatTheClusterStackCreates", "ec2:RunInstances", INSTANCE, {}, False),  # directly, not via the stack
    # The node policy (AdditionalIamPolicies) on a bounded cluster role; no other customer policy.
    ("AttachThePcflowNodePolicy", "iam:AttachRolePolicy", CLUSTER_ROLE, {**BOUNDED, **NODE_POLICY_ARN}, True),
    ("AttachThePcflowNodePolicy", "iam:AttachRolePolicy", CLUSTER_ROLE, NODE_POLICY_ARN, False),  # unbounded
    (
        "AttachThePcflowNodePolicy",
        "iam:AttachRolePolicy",
        CLUSTER_ROLE,
        {**BOUNDED, "iam:PolicyARN": f"arn:aws:iam::{ACCOUNT}:policy/pcflow-cluster-node-admin"},
        False,
    ),
]
#: The same for include/iam/pcflow-cluster-node-policy.json (attached to the nodes' roles; the node setup
#: script's `aws ec2 modify-instance-metadata-options`): a pcflow cluster's node may tighten IMDS, only.
NODES = "NodesOnlyTightenTheirInstanceMetadataOptions"
MODIFY_IMDS = "ec2:ModifyInstanceMetadataOptions"
CLUSTER_NODE = {"aws:ResourceTag/parallelcluster:cluster-name": "pcflow-research-cluster", **OWN}
TIGHTEN = {"ec2:MetadataHttpTokens": "required", "ec2:MetadataHttpPutResponseHopLimit": "1"}
NODE_REQUESTS = [
    (NODES, MODIFY_IMDS, INSTANCE, {**CLUSTER_NODE, **TIGHTEN}, True),
    (NODES, MODIFY_IMDS, INSTANCE, {**CLUSTER_NODE, **TIGHTEN, "ec2:MetadataHttpPutResponseHopLimit": "2"}, False),
    (NODES, MODIFY_IMDS, INSTANCE, {**CLUSTER_NODE, **TIGHTEN, "ec2:MetadataHttpTokens": "optional"}, False),
    (NODES, MODIFY_IMDS, INSTANCE, {**CLUSTER_NODE, "ec2:MetadataHttpTokens": "required"}, False),  # no hop limit
    (NODES, MODIFY_IMDS, INSTANCE, TIGHTEN, False),  # an instance of no cluster
    (NODES, MODIFY_IMDS, INSTANCE, {**TIGHTEN, **OWN}, False),  # pcflow's, but no cluster node (a builder)
]


def simulate(policy: Path, requests: list[tuple], boundary: Path | None = None) -> list[dict]:
    """Each (sid, action, resource, context, allowed) request through the evaluator, in one node process."""
    payload = [{"action": a, "resource": r, "context": c} for _, a, r, c, _ in requests]
    return iam_calls.simulate(policy, payload, boundary=boundary)


def conditioned_sids(policy: Path) -> set[str]:
    return {s["Sid"] for s in json.loads(policy.read_text())["Statement"] if s.get("Condition")}


@pytest.mark.parametrize(
    ("policy", "requests"),
    [(AIRFLOW_POLICY, AIRFLOW_REQUESTS), (PCLUSTER_POLICY, PCLUSTER_REQUESTS), (NODE_POLICY, NODE_REQUESTS)],
)
def test_each_condition_allows_what_pcflow_does_and_refuses_the_rest(policy, requests):
    results = simulate(policy, requests)
    wrong = []
    for (sid, action, resource, context, allowed), result in zip(requests, results, strict=True):
        assert result["decision"] != "error", (sid, action, result)
        assert not result["ignored"], f"{sid}: {action} does not support the condition keys {result['ignored']}"
        if (result["decision"] == "Allowed") != allowed:
            wrong.append(f"{sid}: {action} {resource} {context} -> {result['decision']}, expected allowed={allowed}")
    assert not wrong, "\n".join(wrong)
    tried = {sid for sid, *_, allowed in requests if allowed} & {sid for sid, *_, allowed in requests if not allowed}
    missing = conditioned_sids(policy) - tried
    assert not missing, f"conditioned statements without an allowed and a refused request: {sorted(missing)}"


@pytest.mark.security
def test_the_boundary_caps_what_a_cluster_role_can_do_whatever_is_attached():
    """A node role with AdministratorAccess attached (refused above, but say it got there) is still held
    to the permissions boundary: no IAM, no other buckets, and the dataset buckets read-only."""
    admin = SIMULATOR / "administrator-access.json"
    requests = [
        ("boundary", "ec2:RunInstances", INSTANCE, {}, True),
        ("boundary", "s3:GetObject", "arn:aws:s3:::my-pcflow-datasets/datasets/x.tar", {}, True),
        ("boundary", "iam:CreateUser", f"arn:aws:iam::{ACCOUNT}:user/backdoor", {}, False),
        ("boundary", "s3:GetObject", "arn:aws:s3:::payroll/2026.csv", {}, False),
        # A job cannot overwrite another run's model or plant files under a prefix FSx imports (issue 24):
        ("boundary", "s3:PutObject", "arn:aws:s3:::my-pcflow-datasets/runs/other/model/model.pt", {}, False),
        ("boundary", "s3:DeleteObject", "arn:aws:s3:::my-pcflow-datasets/datasets/x.tar", {}, False),
        ("boundary", "s3:PutObject", "arn:aws:s3:::parallelcluster-abc-v1-do-not-delete/x", {}, True),
        # EC2: what ParallelCluster's nodes and functions do, not ec2:* (issue 24): terminate only the
        # cluster's nodes, tag only at launch or its own nodes, nothing on the network.
        ("boundary", "ec2:TerminateInstances", INSTANCE, {"aws:ResourceTag/parallelcluster:cluster-name": "c"}, True),
        ("boundary", "ec2:TerminateInstances", INSTANCE, {}, False),
        ("boundary", "ec2:CreateTags", INSTANCE, {"ec2:CreateAction": "RunInstances"}, True),
        ("boundary", "ec2:CreateTags", INSTANCE, {}, False),
        ("boundary", "ec2:DescribeInstances", "*", {}, True),
        # IMDS: a cluster node may set its own hop limit to 1 (node-setup.sh), never loosen it.
        ("boundary", "ec2:ModifyInstanceMetadataOptions", INSTANCE, {**CLUSTER_NODE, **TIGHTEN}, True),
        (
            "boundary",
            "ec2:ModifyInstanceMetadataOptions",
            INSTANCE,
            {**CLUSTER_NODE, **TIGHTEN, "ec2:MetadataHttpPutResponseHopLimit": "3"},
            False,
        ),
        ("boundary", "ec2:DeleteVpc", VPC, {}, False),
        (
            "boundary",
            "ec2:AuthorizeSecurityGroupIngress",
            f"arn:aws:ec2:us-east-1:{ACCOUNT}:security-group/sg-1",
            {},
            False,
        ),
    ]
    results = simulate(admin, requests, boundary=BOUNDARY_POLICY)
    assert [r["decision"] == "Allowed" for r in results] == [allowed for *_, allowed in requests], results


def test_a_tag_condition_with_ifexists_would_let_untagged_resources_through(tmp_path):
    """What the first test guards against, shown by the evaluator on the statement this policy used to have."""
    statement = {
        "Effect": "Allow",
        "Action": "ssm:SendCommand",
        "Resource": "arn:aws:ec2:*:*:instance/*",
        "Condition": {"StringLikeIfExists": {"ssm:resourceTag/pcflow:stack": "*"}},
    }
    old = {"Version": "2012-10-17", "Statement": [statement]}
    path = tmp_path / "old-send-command.json"
    path.write_text(json.dumps(old))
    untagged = simulate(path, [("old", "ssm:SendCommand", INSTANCE, {}, False)])
    assert untagged[0]["decision"] == "Allowed"
