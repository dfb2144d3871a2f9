"""The AWS calls a run really made (pcflow.aws.calllog's JSON lines), each judged against the IAM policy
of the principal that makes it on AWS, by the IAM policy evaluator tests/deploy/test_iam.py uses
(`@cloud-copilot/iam-simulate`, `make iam-simulator`).

Who makes a call decides the policy: `airflow` (pcflow's tasks and triggers) the Airflow role's,
include/iam/pcflow-airflow-policy.json; `pcluster` (the pcluster CLI, real or stand-in) the CLI user's,
pcluster-cli-policy.json; `cluster` (what the head node and ParallelCluster's functions do, which the
stand-in does for them) the cluster roles' cap, pcflow-cluster-boundary.json.

A call becomes one or more IAM requests (action, resource ARN, condition context):
- the operation's action: its name under the service's IAM prefix, except S3's (AWS's S3 user guide,
  "Required permissions for Amazon S3 API operations": HeadObject is s3:GetObject, ListObjectsV2
  s3:ListBucket, multipart parts s3:PutObject, ...), plus what a parameter adds (TagSpecifications:
  ec2:CreateTags with `ec2:CreateAction`; an instance profile: iam:PassRole);
- the resource: an ARN built from the parameters (VPC, subnet, instance, image, bucket/object, stack,
  file system, table, topic, dashboard, document), with the tags the run's answers showed for it as
  `aws:ResourceTag/...` (`ssm:resourceTag/...` for SendCommand); the request's tags as
  `aws:RequestTag/...` and `aws:TagKeys`. Where no ARN can be built (a Describe, a creation) it is `*`;
- what AWS does with the caller's permissions on its behalf: the resources of a CloudFormation stack
  it creates (`aws:CalledViaFirst`: cloudformation), and the service-linked role a service creates on
  first use in an account (FSx for Lustre's, and its S3 data repository's, on CreateFileSystem: the
  FSx user guide, "Using service-linked roles for Amazon FSx"), which moto does not model.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
POLICIES = REPO / "include" / "iam"
SIMULATOR = REPO / "tests" / "deploy" / "iam_simulate"
ACCOUNT = "123456789012"  # moto's account, and the evaluator's
#: The policy each caller's calls are judged against.
POLICY_OF = {
    "airflow": POLICIES / "pcflow-airflow-policy.json",
    "pcluster": POLICIES / "pcluster-cli-policy.json",
    "cluster": POLICIES / "pcflow-cluster-boundary.json",
}
#: IAM prefixes that are not botocore's service name.
IAM_PREFIX = {"service-quotas": "servicequotas", "resourcegroupstaggingapi": "tag"}
#: S3 operations whose IAM action has another name. Multipart uploads (s3transfer) need s3:PutObject.
S3_ACTIONS = {
    "HeadObject": "GetObject",
    "HeadBucket": "ListBucket",
    "ListObjectsV2": "ListBucket",
    "ListObjects": "ListBucket",
    "ListBuckets": "ListAllMyBuckets",
    "DeleteObjects": "DeleteObject",
    "PutBucketEncryption": "PutEncryptionConfiguration",
    "GetBucketLifecycleConfiguration": "GetLifecycleConfiguration",
    "PutBucketLifecycleConfiguration": "PutLifecycleConfiguration",
    "PutPublicAccessBlock": "PutBucketPublicAccessBlock",
    "GetPublicAccessBlock": "GetBucketPublicAccessBlock",
    "GetBucketEncryption": "GetEncryptionConfiguration",
    "CreateMultipartUpload": "PutObject",
    "UploadPart": "PutObject",
    "CompleteMultipartUpload": "PutObject",
    "ListObjectVersions": "ListBucketVersions",
}
#: S3 actions on objects (the others are on the bucket, ListAllMyBuckets on `*`).
S3_OBJECT_ACTIONS = {"GetObject", "GetObjectVersion", "PutObject", "PutObjectTagging", "DeleteObject"}
S3_OBJECT_ACTIONS |= {"DeleteObjectVersion", "AbortMultipartUpload", "GetObjectTagging"}
#: Permissions a request parameter adds on top of the operation's own action: (operation, parameter) -> action.
PARAMETER_ACTIONS = {
    (("ec2", "RunInstances"), "IamInstanceProfile"): "iam:PassRole",
    (("ec2", "*"), "TagSpecifications"): "ec2:CreateTags",
    (("s3", "PutObject"), "Tagging"): "s3:PutObjectTagging",
    (("s3", "GetObject"), "VersionId"): "s3:GetObjectVersion",
}
#: EC2 request parameters naming a resource, and its ARN's resource type (images and snapshots have no account).
EC2_RESOURCES = {
    "InstanceId": "instance",
    "InstanceIds": "instance",
    "Resources": None,  # CreateTags: any of the kinds below, by the id's prefix
    "VpcId": "vpc",
    "SubnetId": "subnet",
    "SubnetIds": "subnet",
    "GroupId": "security-group",
    "SecurityGroupIds": "security-group",
    "RouteTableId": "route-table",
    "InternetGatewayId": "internet-gateway",
    "NatGatewayId": "natgateway",
    "AllocationId": "elastic-ip",
    "VpcEndpointId": "vpc-endpoint",
    "VpcEndpointIds": "vpc-endpoint",
    "NetworkInterfaceId": "network-interface",
    "ImageId": "image",
    "SnapshotId": "snapshot",
    "KeyName": "key-pair",
    "AssociationId": None,  # the route table's or address' it belongs to (the answers' `owners`)
    "AttachmentId": None,  # the network interface's
}
ID_PREFIXES = {
    "i": "instance",
    "vpc": "vpc",
    "subnet": "subnet",
    "sg": "security-group",
    "rtb": "route-table",
    "igw": "internet-gateway",
    "nat": "natgateway",
    "eipalloc": "elastic-ip",
    "vpce": "vpc-endpoint",
    "eni": "network-interface",
    "ami": "image",
    "snap": "snapshot",
}
#: What CloudFormation creates for a stack's resource, with the stack creator's permissions.
STACK_RESOURCE_ACTIONS = {
    "AWS::EC2::Instance": ["ec2:RunInstances", "ec2:CreateTags"],
    "AWS::FSx::FileSystem": ["fsx:CreateFileSystem", "fsx:TagResource"],
    "AWS::DynamoDB::Table": ["dynamodb:CreateTable"],
}
VIA_CLOUDFORMATION = {"aws:CalledViaFirst": "cloudformation.amazonaws.com"}
#: Service-linked roles FSx for Lustre creates on a file system's creation, when the account has none yet:
#: its own, and the S3 data repository's when the file system imports from or exports to S3.
FSX_ROLE = ("fsx.amazonaws.com", "AWSServiceRoleForAmazonFSx")
FSX_S3_ROLE = ("s3.data-source.lustre.fsx.amazonaws.com", "AWSServiceRoleForFSxS3Access_*")


@dataclass(frozen=True)
class Request:
    action: str
    resource: str
    context: tuple[tuple[str, Any], ...] = ()

    def payload(self) -> dict[str, Any]:
        return {"action": self.action, "resource": self.resource, "context": dict(self.context)}


def request(action: str, resource: str = "*", context: dict[str, Any] | None = None) -> Request:
    frozen = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in (context or {}).items()))
    return Request(action, resource, frozen)


def iam_action(service: str, operation: str) -> str:
    if service == "s3":
        operation = S3_ACTIONS.get(operation, operation)
    return f"{IAM_PREFIX.get(service, service)}:{operation}"


# -- a call's requests ------------------------------------------------------------------------------


def requests_for(call: dict[str, Any], tags: dict[str, dict[str, str]]) -> list[Request]:
    """The IAM requests one recorded call makes; `tags`: what the run's answers showed on each resource."""
    service, operation, params = call["service"], call["operation"], call.get("params") or {}
    region = call.get("region") or "us-east-1"
    action = iam_action(service, operation)
    build = RESOURCE_BUILDERS.get(service)
    found = build(action, params, region, tags) if build else [request(action)]
    if service == "ec2" and params.get("TagSpecifications"):
        tagged = request_tags(params["TagSpecifications"])
        found = [request(r.action, r.resource, {**dict(r.context), **tagged}) for r in found]
        found.append(request("ec2:CreateTags", "*", {**tagged, "ec2:CreateAction": operation}))
    if (service, operation) == ("ec2", "RunInstances") and params.get("IamInstanceProfile"):
        found.append(passed_role(params["IamInstanceProfile"]))
    for ((svc, op), parameter), extra in PARAMETER_ACTIONS.items():  # RunInstances' and EC2's: above
        if (svc, op) == (service, operation) and parameter in params and extra not in {r.action for r in found}:
            found.append(request(extra, found[0].resource, dict(found[0].context)))
    if (service, operation) in (("cloudformation", "CreateStack"), ("cloudformation", "UpdateStack")):
        found += stack_resource_requests(params.get("TemplateBody"))
    return found


def request_tags(specifications: Iterable[dict[str, Any]]) -> dict[str, Any]:
    pairs = {t["Key"]: t["Value"] for spec in specifications for t in spec.get("Tags", [])}
    return tag_context(pairs, "aws:RequestTag")


def tag_context(pairs: dict[str, str], prefix: str) -> dict[str, Any]:
    context: dict[str, Any] = {f"{prefix}/{k}": v for k, v in pairs.items()}
    if prefix == "aws:RequestTag" and pairs:
        context["aws:TagKeys"] = sorted(pairs)
    return context


def passed_role(profile: dict[str, str]) -> Request:
    """RunInstances with an instance profile passes its role: pcflow's builder profile and its role share
    their name (docs/deploy.md)."""
    name = profile.get("Name") or profile.get("Arn", "").rsplit("/", 1)[-1]
    return request("iam:PassRole", f"arn:aws:iam::{ACCOUNT}:role/{name}", {"iam:PassedToService": "ec2.amazonaws.com"})


def stack_resource_requests(body: str | None) -> list[Request]:
    """What CloudFormation does with the caller's permissions for the stack's resources."""
    if not body:
        return []
    template = yaml.safe_load(body) or {}  # JSON is YAML
    found = []
    for resource in (template.get("Resources") or {}).values():
        for action in STACK_RESOURCE_ACTIONS.get(resource.get("Type"), []):
            found.append(request(action, "*", VIA_CLOUDFORMATION))
        if resource.get("Type") == "AWS::FSx::FileSystem":
            found += [service_linked_role(*FSX_ROLE)]
            lustre = (resource.get("Properties") or {}).get("LustreConfiguration") or {}
            if {"ImportPath", "ExportPath", "AutoImportPolicy"} & set(lustre):
                found += [service_linked_role(*FSX_S3_ROLE)]
    return found


def service_linked_role(service: str, role: str) -> Request:
    arn = f"arn:aws:iam::{ACCOUNT}:role/aws-service-role/{service}/{role}"
    return request("iam:CreateServiceLinkedRole", arn, {"iam:AWSServiceName": service, **VIA_CLOUDFORMATION})


# -- resources, per service -------------------------------------------------------------------------


def ec2_arn(kind: str, ident: str, region: str) -> str:
    account = "" if kind in ("image", "snapshot") else ACCOUNT
    return f"arn:aws:ec2:{region}:{account}:{kind}/{ident}"


def ec2_requests(action: str, params: dict, region: str, tags: dict) -> list[Request]:
    """One request per resource the call names (all of RunInstances' image, subnet, groups, key pair),
    with the tags seen on it; `*` (the resource being created) when it names none."""
    found = []
    owners = tags.get(OWNERS, {})
    for name, kind in EC2_RESOURCES.items():
        value = params.get(name)
        idents = value if isinstance(value, list) else [value] if isinstance(value, str) else []
        for ident in (owners.get(i, i) if name in ("AssociationId", "AttachmentId") else i for i in idents):
            arn_kind = kind or ID_PREFIXES.get(ident.split("-", 1)[0])
            seen = tags.get(ident) or tags.get(owners.get(ident, ""), {})  # a snapshot: its image's tags
            context = tag_context(seen, "aws:ResourceTag")
            if action == "ec2:CreateTags":
                context |= tag_context({t["Key"]: t["Value"] for t in params.get("Tags", [])}, "aws:RequestTag")
            found.append(request(action, ec2_arn(arn_kind, ident, region) if arn_kind else "*", context))
    if action == "ec2:RunInstances" or params.get("TagSpecifications") or not found:
        found.insert(0, request(action))  # the resource being created
    return found


def s3_requests(action: str, params: dict, region: str, tags: dict) -> list[Request]:
    bucket, key = params.get("Bucket"), params.get("Key")
    if not bucket:
        return [request(action)]
    if action.split(":")[1] in S3_OBJECT_ACTIONS:
        return [request(action, f"arn:aws:s3:::{bucket}/{key or '*'}")]
    return [request(action, f"arn:aws:s3:::{bucket}")]


def cloudformation_requests(action: str, params: dict, region: str, tags: dict) -> list[Request]:
    name = params.get("StackName")
    if not name:
        return [request(action)]
    arn = name if name.startswith("arn:") else f"arn:aws:cloudformation:{region}:{ACCOUNT}:stack/{name}/*"
    seen = next((t for ident, t in tags.items() if ident == name or f":stack/{name}/" in ident), {})
    context = tag_context(seen, "aws:ResourceTag")
    if params.get("Tags"):
        context |= tag_context({t["Key"]: t["Value"] for t in params["Tags"]}, "aws:RequestTag")
    return [request(action, arn, context)]


def fsx_requests(action: str, params: dict, region: str, tags: dict) -> list[Request]:
    ident = params.get("FileSystemId")
    if not ident:
        return [request(action)]
    context = tag_context(tags.get(ident, {}), "aws:ResourceTag")
    return [request(action, f"arn:aws:fsx:{region}:{ACCOUNT}:file-system/{ident}", context)]


def ssm_requests(action: str, params: dict, region: str, tags: dict) -> list[Request]:
    if action != "ssm:SendCommand":
        return [request(action)]
    document = f"arn:aws:ssm:{region}:{ACCOUNT}:document/{params.get('DocumentName')}"
    found = [request(action, document)]
    for ident in params.get("InstanceIds", []):
        context = tag_context(tags.get(ident, {}), "ssm:resourceTag")
        found.append(request(action, ec2_arn("instance", ident, region), context))
    return found


def named_resource_requests(action: str, params: dict, region: str, tags: dict) -> list[Request]:
    """Services whose calls name their resource by one parameter (a table, topic, dashboard, profile)."""
    prefix = action.split(":", maxsplit=1)[0]
    if prefix == "cloudwatch" and params.get("Namespace"):
        return [request(action, "*", {"cloudwatch:namespace": params["Namespace"]})]
    for parameter, arn in NAMED_RESOURCES.get(prefix, {}).items():
        if params.get(parameter):
            return [request(action, arn.format(region=region, account=ACCOUNT, name=params[parameter]))]
    return [request(action)]


NAMED_RESOURCES = {
    "dynamodb": {"TableName": "arn:aws:dynamodb:{region}:{account}:table/{name}"},
    "sns": {"TopicArn": "{name}"},
    "cloudwatch": {"DashboardName": "arn:aws:cloudwatch::{account}:dashboard/{name}"},
    "iam": {
        "InstanceProfileName": "arn:aws:iam::{account}:instance-profile/{name}",
        "RoleName": "arn:aws:iam::{account}:role/{name}",
    },
}
RESOURCE_BUILDERS = {
    "ec2": ec2_requests,
    "s3": s3_requests,
    "cloudformation": cloudformation_requests,
    "fsx": fsx_requests,
    "ssm": ssm_requests,
    **dict.fromkeys(("dynamodb", "sns", "cloudwatch", "iam"), named_resource_requests),
}


# -- the evaluator --------------------------------------------------------------------------------


NOT_AUTHORIZED = "NotAuthorized"  # a named resource IAM does not authorize for the action


@cache
def simulator_script() -> Path:
    module = SIMULATOR / "node_modules" / "@cloud-copilot" / "iam-simulate"
    if not module.is_dir():
        raise RuntimeError("the IAM policy evaluator is not installed: run `make iam-simulator` (npm ci)")
    return SIMULATOR / "simulate.mjs"


def simulate(policy: Path, requests: list[dict[str, Any]], boundary: Path | None = None) -> list[dict[str, Any]]:
    """Each {action, resource, context} through the evaluator, in one node process: one result each,
    {"decision": "Allowed" | "ImplicitlyDenied" | "ExplicitlyDenied" | "error", "ignored": [...]}."""
    payload = {
        "policies": [{"name": policy.stem, "policy": json.loads(policy.read_text())}],
        "boundary": json.loads(boundary.read_text()) if boundary else None,
        "requests": requests,
    }
    proc = subprocess.run(
        ["node", str(simulator_script())],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        cwd=SIMULATOR,
        check=True,
    )
    return json.loads(proc.stdout)


def decide(policy: Path, requests: list[Request]) -> list[str]:
    """The evaluator's decision on each request. An action without resource types (a Describe) is
    judged on `*`, as AWS does, when the ARN built for it names a resource; a resource the call names
    that is none of the action's resource types (CreateRoute's NAT gateway) is not authorized at all."""
    results = simulate(policy, [r.payload() for r in requests])
    for result in results:
        if (result.get("errors") or {}).get("message") == "no.resource.types":
            result["decision"] = NOT_AUTHORIZED
    again = [
        i for i, result in enumerate(results) if (result.get("errors") or {}).get("message") == "must.use.wildcard"
    ]
    if again:
        retried = simulate(policy, [{**requests[i].payload(), "resource": "*"} for i in again])
        for i, result in zip(again, retried, strict=True):
            results[i] = result
    return [result["decision"] for result in results]


def read_calls(path: Path) -> list[dict[str, Any]]:
    """A call log's calls (pcflow.aws.calllog); a line a killed process left half-written is skipped."""
    calls = []
    for line in path.read_text().splitlines():
        try:
            calls.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return calls


OWNERS = "<owners>"  # tags_by_resource's entry of association/attachment id -> owner id


def tags_by_resource(calls: Iterable[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """What the run's answers showed: each resource id's tags, and (under OWNERS) whose each
    association or attachment id is."""
    found: dict[str, dict[str, str]] = {OWNERS: {}}
    for call in calls:
        for ident, pairs in (call.get("tags") or {}).items():
            found.setdefault(ident, {}).update(pairs)
        found[OWNERS].update(call.get("owners") or {})
    return found


def evaluate(calls: list[dict[str, Any]], policies: dict[str, Path] = POLICY_OF) -> dict[str, Any]:
    """{"calls": N, "denied": D} over the recorded calls (D: calls with a request their caller's policy
    does not allow), with "denials" (each denied request once, and who made it) when D > 0."""
    tags = tags_by_resource(calls)
    per_call = [(call, requests_for(call, tags)) for call in calls]
    decisions: dict[tuple[str, Request], str] = {}
    for caller in sorted({call.get("caller", "airflow") for call in calls}):
        if caller not in policies:
            raise ValueError(f"calls by {caller!r}, which has no policy (one of {sorted(policies)})")
        unique = sorted(
            {r for call, found in per_call if call.get("caller", "airflow") == caller for r in found}, key=str
        )
        decisions |= {(caller, r): d for r, d in zip(unique, decide(policies[caller], unique), strict=True)}
    denials: dict[str, None] = {}
    denied = 0
    for call, found in per_call:
        caller = call.get("caller", "airflow")
        refused = [r for r in found if decisions[(caller, r)] not in ("Allowed", NOT_AUTHORIZED)]
        if all(decisions[(caller, r)] == NOT_AUTHORIZED for r in found):
            refused = found  # an ARN built wrong must not pass for an allowed call
        denied += bool(refused)
        for r in refused:
            denials[f"{caller}: {r.action} on {r.resource} {dict(r.context)} -> {decisions[(caller, r)]}"] = None
    summary: dict[str, Any] = {"calls": len(calls), "denied": denied}
    if denials:
        summary["denials"] = list(denials)
    return summary
