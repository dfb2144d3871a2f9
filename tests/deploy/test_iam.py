"""The Airflow role's IAM policy (include/iam/pcflow-airflow-policy.json) against the AWS calls pcflow's
code makes: every call allowed, every allowed action called, no wildcard actions.

The calls are read from plugins/pcflow's syntax tree, not from a hand-kept list: a method call or a
string (paginators, waiters, teardown's operation tables) whose name is an operation of a service pcflow
makes a client for, in botocore's service model; waiter names are mapped to the operation they poll.
Operations become IAM actions by name, except S3's, whose actions are named differently (AWS's S3 user
guide, "Required permissions for Amazon S3 API operations").
"""

from __future__ import annotations

import ast
import json
from collections import defaultdict
from functools import cache
from pathlib import Path

import botocore.session
from botocore import xform_name

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "plugins" / "pcflow"
AIRFLOW_POLICY = REPO / "include" / "iam" / "pcflow-airflow-policy.json"
PCLUSTER_POLICY = REPO / "include" / "iam" / "pcluster-cli-policy.json"

#: The Amazon provider's hooks pcflow uses, and the client each makes.
PROVIDER_HOOKS = {"EC2Hook": "ec2", "S3Hook": "s3", "CloudFormationHook": "cloudformation"}
#: IAM action prefixes of the services pcflow calls (a new service fails the test until it is added here).
IAM_PREFIX = {s: s for s in ("ec2", "s3", "ssm", "fsx", "cloudwatch", "cloudformation", "sts", "iam")}
#: S3 operations whose IAM action has another name. Multipart uploads (s3transfer) need s3:PutObject.
S3_ACTIONS = {
    "HeadObject": "GetObject",
    "HeadBucket": "ListBucket",
    "ListObjectsV2": "ListBucket",
    "ListBuckets": "ListAllMyBuckets",
    "DeleteObjects": "DeleteObject",
    "PutBucketEncryption": "PutEncryptionConfiguration",
    "GetBucketLifecycleConfiguration": "GetLifecycleConfiguration",
    "PutBucketLifecycleConfiguration": "PutLifecycleConfiguration",
    "PutPublicAccessBlock": "PutBucketPublicAccessBlock",
    "CreateMultipartUpload": "PutObject",
    "UploadPart": "PutObject",
    "CompleteMultipartUpload": "PutObject",
}
#: What s3transfer's TransferManager calls for an upload (multipart above its threshold, abort on failure).
TRANSFER_MANAGER_CALLS = {
    ("s3", op) for op in ("PutObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload")
} | {("s3", "AbortMultipartUpload")}
#: Permissions a request parameter adds on top of the operation's own action: (operation, parameter) -> action.
PARAMETER_ACTIONS = {
    (("ec2", "RunInstances"), "IamInstanceProfile"): "iam:PassRole",
    (("ec2", "*"), "TagSpecifications"): "ec2:CreateTags",
    (("s3", "PutObject"), "Tagging"): "s3:PutObjectTagging",
    (("s3", "GetObject"), "VersionId"): "s3:GetObjectVersion",
}
#: Method names that are AWS operations but are called on something else here.
NOT_AWS_CALLS = {"get_template": "jinja2.Environment.get_template (report and batch templates)"}
#: Operation names two services share: the one pcflow calls.
SHARED_NAMES = {"delete_snapshot": "ec2", "describe_snapshots": "ec2"}


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
    return calls


def iam_action(service: str, operation: str) -> str:
    assert service in IAM_PREFIX, f"pcflow calls {service}: add its IAM prefix to IAM_PREFIX"
    if service == "s3":
        operation = S3_ACTIONS.get(operation, operation)
    return f"{IAM_PREFIX[service]}:{operation}"


def needed_actions() -> set[str]:
    calls = called_operations()
    needed = {iam_action(*call) for call in calls}
    for ((service, operation), parameter), action in PARAMETER_ACTIONS.items():
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
        ("fsx", "DescribeDataRepositoryTasks"),
        ("cloudformation", "DescribeStacks"),
        ("s3", "AbortMultipartUpload"),
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
