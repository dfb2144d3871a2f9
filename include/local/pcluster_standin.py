"""STAND-IN for the `pcluster` CLI (aws-parallelcluster 3.16) on the local stack, whose cluster is the
local Slurm: its head node is this stack's (sshd, slurmctld), its compute nodes are the local slurmd.

Why: a real `pcluster create-cluster` synthesises its CloudFormation template with CDK, and moto's
CloudFormation refuses that template ("Missing parameter ConfigVersion", see probes.md), so no real
cluster can be made on the emulator. So:
- `create-cluster --dryrun true`, `version` and every command not listed below run the REAL CLI
  (`.venv-pcluster`): ParallelCluster's own validators judge the config.
- `create-cluster`, `describe-cluster`, `describe-cluster-instances`, `update-cluster`, `delete-cluster`
  answer as pcluster 3.16's documented JSON does (response syntax, "Cluster 'X' does not exist ..."
  messages, exit code 1 on errors), and do the AWS side for real on the moto server: the stack named
  after the cluster with the config's Tags plus `parallelcluster:version` and pcluster's outputs
  (HeadNodeInstanceID, HeadNodePrivateIP, HeadNodePrivateDnsName, FSXIds), its FSx for Lustre file
  system (moto_standins.py: a local directory, seen at /fsx by the nodes), a head-node instance and one
  compute instance per local Slurm node the queue's MaxCount allows, tagged as pcluster tags them.
- What moto cannot give, the stand-in supplies from the local stack: the head node's console output
  carries this stack's SSH host key between cloud-init's markers (pcflow reads it there, as on AWS),
  and the head node's public address is the local head node's (sshd on loopback).
update-cluster follows pcluster's controller (DryrunOperationException's message and changeSet;
UpdateClusterBadRequestException's "Update failure" with updateValidationErrors) with a simplified
update policy: queue sizes and tags update in place, anything else is refused as UNSUPPORTED.
`PCFLOW_STANDIN_FAIL=<failureCode>` at create time makes describe-cluster report CREATE_FAILED with that
code, as pcluster does after a failed head-node wait condition. `PCFLOW_STANDIN_ICE=<queue>[:<code>]` at create
time makes that queue's nodes unlaunchable (EC2's InsufficientInstanceCapacity by default): each queue becomes
a Slurm partition of the local nodes and the short queue's node is DOWN with the reason ParallelCluster's
slurm_resume writes, `(Code:<code>)Failure when resuming nodes` (carve_partitions); delete-cluster undoes it.
`PCFLOW_STANDIN_ICE=<type>@<zone>[,<type>@<zone>...][:<code>]` says it as EC2 does, per instance type and zone:
short are the queues all of whose types are short in their subnet's zone (short_queues), so a queue of the same
type in another zone's subnet is not.
Without it the cluster's queues are the local Slurm's one partition, `compute`. The nodes' custom action scripts
(OnNodeConfigured, the head node's and each queue's) are downloaded from S3 as the nodes would, with the
cluster's rights, and one that cannot be read fails the cluster as pcluster reports it
(OnNodeConfiguredDownloadFailure); they are not run (they would change this host's accounts and firewall:
tests/pcflow/cluster/test_node_setup.py runs pcflow's on fake roots). describe/update-compute-fleet keep the
fleet's status where pcluster 3.2+ does, item COMPUTE_FLEET of the stack's DynamoDB table
`parallelcluster-<name>` (moto's DynamoDB, deleted with the stack); the head node's clustermgtd, which
moves a STOP_REQUESTED fleet to STOPPED (and START_REQUESTED to RUNNING), acts at the next look instead
of within a minute (the local Slurm's nodes themselves stay up).

It answers only the local stack's emulator (AWS_ENDPOINT_URL on loopback): pointed at AWS, it refuses.
"""

from __future__ import annotations

import argparse
import datetime as dt
import fnmatch
import json
import os
import ssl
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import boto3
import yaml
from botocore.exceptions import ClientError

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stack as local_stack  # include/local/stack.py: this stack's head node and Slurm

sys.path.insert(0, str(local_stack.REPO / "plugins"))  # this checkout's pcflow, as demo.py imports it
from pcflow.aws.calllog import acting_as

#: What the stand-in does for the cluster itself (its head node's clustermgtd, the stack's cleanup on
#: deletion) is the cluster roles' call on AWS, not the CLI user's: a call log says so.
BY_THE_CLUSTER = "cluster"

VERSION = "3.16.1"
REAL_PCLUSTER = local_stack.REPO / ".venv-pcluster" / "bin" / "pcluster"
FAIL_TAG = "pcflow-standin:fail"
#: pcluster's failureReason of each failureCode the stand-in reports (pcluster.models.cluster_resources).
FAILURE_REASONS = {"OnNodeConfiguredDownloadFailure": "Failed to download OnNodeConfigured script."}
NODE_TAG = "pcflow-standin:slurm-node"
#: `PCFLOW_STANDIN_ICE=<queue>[:<code>]` at create time: that queue's nodes cannot be launched (see `carve_partitions`);
#: `<type>@<zone>[,...][:<code>]`: the queues whose types are all short in their subnet's zone (`short_queues`).
ICE_ENV = "PCFLOW_STANDIN_ICE"
ICE_TAG = "pcflow-standin:ice"
ICE_CODE = "InsufficientInstanceCapacity"
#: The partition the local Slurm has without the stand-in's (include/local/slurmconf.py).
LOCAL_PARTITION = "compute"
#: Settings the stand-in updates in place (pcluster: RESIZE_UPDATE_STRATEGY_ON_REMOVE / SUPPORTED).
UPDATABLE = ("Scheduling.SlurmQueues.", "Tags")
EMULATED = (
    "create-cluster",
    "describe-cluster",
    "describe-cluster-instances",
    "update-cluster",
    "delete-cluster",
    "describe-compute-fleet",
    "update-compute-fleet",
)
LIVE = ["pending", "running", "stopping", "stopped"]
#: The local head node: its sshd listens here (stack.py's sshd_config).
HEAD_NODE_ADDRESS = "127.0.0.1"


def out(payload: dict, code: int = 0) -> None:
    print(json.dumps(payload, indent=2, default=str))
    sys.exit(code)


def not_found(name: str, hint: str = "") -> None:
    message = f"Cluster '{name}' does not exist or belongs to an incompatible ParallelCluster major version."
    out({"message": message + hint}, 1)


def iso(value: dt.datetime | None) -> str | None:
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z") if value else None


def on_the_emulator() -> bool:
    host = urllib.parse.urlsplit(os.environ.get("AWS_ENDPOINT_URL", "")).hostname or ""
    return host in ("127.0.0.1", "localhost", "::1")


def run_real_cli() -> None:
    if not os.access(REAL_PCLUSTER, os.X_OK):
        out({"message": f"no real pcluster CLI at {REAL_PCLUSTER}: run `make pcluster`"}, 2)
    os.execv(REAL_PCLUSTER, [str(REAL_PCLUSTER), *sys.argv[1:]])


# -- what the local stack supplies ----------------------------------------------------------------


def local_host_key() -> str:
    layout = local_stack.load_layout(create=False)
    return " ".join(layout.host_key.with_suffix(".pub").read_text().split()[:2])


def local_nodes() -> list[tuple[str, str]]:
    """(name, address) of each local Slurm compute node, as slurmctld knows them."""
    layout = local_stack.load_layout(create=False)
    text = local_stack.run(["scontrol", "-o", "show", "node"], env=layout.slurm_env()).stdout
    nodes = []
    for line in text.splitlines():
        fields = dict(word.split("=", 1) for word in line.split() if "=" in word)
        if fields.get("NodeName"):
            nodes.append((fields["NodeName"], fields.get("NodeAddr") or fields["NodeName"]))
    return nodes


def console_output(host_key: str) -> str:
    """What cloud-init prints on the console once the head node's sshd has its keys."""
    return "\n".join(
        [
            "[   12.345678] cloud-init[1234]: Cloud-init v. 24.1 running 'modules:final'",
            "-----BEGIN SSH HOST KEY KEYS-----",
            f"{host_key} root@head-node",
            "-----END SSH HOST KEY KEYS-----",
            "[   23.456789] cloud-init[1234]: Cloud-init v. 24.1 finished",
            "",
        ]
    )


def set_console_output(instance_id: str, text: str) -> None:
    """moto prints one sample text for every instance: moto_standins.py's route sets this one's."""
    endpoint = os.environ["AWS_ENDPOINT_URL"].rstrip("/")
    body = json.dumps({"instance_id": instance_id, "output": text}).encode()
    url = f"{endpoint}/moto-api/static/ec2/console-output"
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    context = ssl.create_default_context(cafile=os.environ.get("AWS_CA_BUNDLE"))
    with urllib.request.urlopen(request, context=context, timeout=30) as answer:
        answer.read()


# -- CloudFormation: the stack pcluster would make ------------------------------------------------


def flatten(value, path: str = "") -> dict[str, str]:
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in flatten(item, f"{path}{key}.").items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in flatten(item, f"{path}{i}.").items()}
    return {path.rstrip("."): str(value)}


def changes(old: dict, new: dict) -> list[dict]:
    before, after = flatten(old), flatten(new)
    return [
        {"parameter": key, "currentValue": before.get(key, "-"), "requestedValue": after.get(key, "-")}
        for key in sorted(set(before) | set(after))
        if before.get(key) != after.get(key)
    ]


def file_system_resource(storage: dict, subnet: str, tags: list[dict]) -> dict:
    """An FsxLustre shared storage as pcluster's template declares it (SCRATCH_2's import/export paths)."""
    settings = storage.get("FsxLustreSettings") or {}
    lustre = {"DeploymentType": settings.get("DeploymentType", "SCRATCH_2")}
    for key in ("ImportPath", "ExportPath", "AutoImportPolicy", "PerUnitStorageThroughput"):
        if key in settings:
            lustre[key] = settings[key]
    properties = {
        "FileSystemType": "LUSTRE",
        "StorageCapacity": settings.get("StorageCapacity", 1200),
        "SubnetIds": [subnet],
        "LustreConfiguration": lustre,
        "Tags": [*tags, {"Key": "Name", "Value": storage["Name"]}],
    }
    return {"Type": "AWS::FSx::FileSystem", "Properties": properties}


def head_node_resource(config: dict, name: str, tags: list[dict]) -> dict:
    """The head node, a resource of the stack as in pcluster's template (so it comes and goes with it)."""
    own = {"parallelcluster:cluster-name": name, "parallelcluster:node-type": "HeadNode", "Name": "HeadNode"}
    properties = {
        "ImageId": config["Image"].get("CustomAmi") or "ami-12c6146b",
        "InstanceType": config["HeadNode"]["InstanceType"],
        "SubnetId": config["HeadNode"]["Networking"]["SubnetId"],
        "Tags": [*({"Key": k, "Value": v} for k, v in own.items()), *tags],
    }
    return {"Type": "AWS::EC2::Instance", "Properties": properties}


def template_for(config: dict, name: str, tags: list[dict]) -> str:
    """The stack: the cluster's config (as pcluster keeps it, for updates), its head node and file
    systems, and pcluster's outputs."""
    resources: dict = {
        "HeadNodeWaitConditionHandle": {"Type": "AWS::CloudFormation::WaitConditionHandle"},
        "HeadNode": head_node_resource(config, name, tags),
        "DynamoDBTable": {  # pcluster's table: the compute fleet's status lives there
            "Type": "AWS::DynamoDB::Table",
            "Properties": {
                "TableName": f"parallelcluster-{name}",
                "KeySchema": [{"AttributeName": "Id", "KeyType": "HASH"}],
                "AttributeDefinitions": [{"AttributeName": "Id", "AttributeType": "S"}],
                "BillingMode": "PAY_PER_REQUEST",
            },
        },
    }
    outputs: dict = {
        "HeadNodeInstanceID": {"Description": "ID of the head node instance", "Value": {"Ref": "HeadNode"}},
        "HeadNodePrivateIP": {
            "Description": "Private IP Address of the head node",
            "Value": {"Fn::GetAtt": ["HeadNode", "PrivateIp"]},
        },
        "HeadNodePrivateDnsName": {
            "Description": "Private DNS name of the head node",
            "Value": {"Fn::GetAtt": ["HeadNode", "PrivateDnsName"]},
        },
    }
    subnet = config["HeadNode"]["Networking"]["SubnetId"]
    file_systems = [
        s
        for s in config.get("SharedStorage") or []
        if s.get("StorageType") == "FsxLustre" and not (s.get("FsxLustreSettings") or {}).get("FileSystemId")
    ]
    for index, storage in enumerate(file_systems):
        resources[f"FSx{index}"] = file_system_resource(storage, subnet, tags or [])
    if file_systems:
        refs = [{"Ref": f"FSx{i}"} for i in range(len(file_systems))]
        outputs["FSXIds"] = {"Description": "FSX Filesystem IDs", "Value": {"Fn::Join": [",", refs]}}
    return json.dumps({"Metadata": {"ClusterConfig": config}, "Resources": resources, "Outputs": outputs})


def stack_of(cfn, name: str) -> dict | None:
    try:
        return cfn.describe_stacks(StackName=name)["Stacks"][0]
    except Exception:
        return None


def cluster_instances(ec2, name: str, node_type: str | None = None) -> list[dict]:
    filters = [
        {"Name": "tag:parallelcluster:cluster-name", "Values": [name]},
        {"Name": "instance-state-name", "Values": LIVE},
    ]
    if node_type:
        filters.append({"Name": "tag:parallelcluster:node-type", "Values": [node_type]})
    found = [i for r in ec2.describe_instances(Filters=filters)["Reservations"] for i in r["Instances"]]
    return sorted(found, key=lambda i: (tag_of(i, "parallelcluster:node-type") != "HeadNode", i["LaunchTime"]))


def tag_of(resource: dict, key: str) -> str | None:
    return next((t["Value"] for t in resource.get("Tags", []) if t["Key"] == key), None)


def launch(ec2, config: dict, name: str, tags: list[dict], node: tuple[dict, str, str]) -> dict:
    """One instance of the cluster, tagged as pcluster tags its nodes (plus the config's Tags)."""
    node_tags, instance_type, subnet = node
    own = [{"Key": k, "Value": v} for k, v in {"parallelcluster:cluster-name": name, **node_tags}.items()]
    return ec2.run_instances(
        ImageId=config["Image"].get("CustomAmi") or "ami-12c6146b",
        MinCount=1,
        MaxCount=1,
        InstanceType=instance_type,
        SubnetId=subnet,
        TagSpecifications=[{"ResourceType": "instance", "Tags": [*own, *tags]}],
    )["Instances"][0]


def resource_types(resource: dict) -> list[str]:
    """A compute resource's instance types: its `InstanceType`, or its flexible `Instances` in order."""
    return (
        [resource["InstanceType"]] if "InstanceType" in resource else [i["InstanceType"] for i in resource["Instances"]]
    )


def compute_fleet(config: dict) -> list[tuple[dict, str, str]]:
    """The first queue's nodes this stand-in has: the local Slurm's compute nodes, as many as its MaxCount
    allows (they are always up, so they are there from the start, as static nodes are). The other queues (a
    capacity fallback's) launch nothing here: on AWS their dynamic nodes start only for a job moved there."""
    slots = []
    for queue in config["Scheduling"]["SlurmQueues"][:1]:
        subnet = queue["Networking"]["SubnetIds"][0]
        for resource in queue["ComputeResources"]:
            tags = {
                "parallelcluster:node-type": "Compute",
                "parallelcluster:queue-name": queue["Name"],
                "parallelcluster:compute-resource-name": resource["Name"],
                "Name": "Compute",
            }
            # Flexible instance types (`Instances`): EC2 Fleet picks one per launch; the stand-in takes the first.
            kind = resource_types(resource)[0]
            slots += [(tags, kind, subnet)] * int(resource.get("MaxCount", 10))
    pairs = zip(slots, local_nodes(), strict=False)  # the shorter decides
    return [({**tags, NODE_TAG: node}, kind, subnet) for (tags, kind, subnet), (node, _) in pairs]


# -- insufficient capacity: the Slurm side of ParallelCluster's fast fail-over ---------------------


def slurm(*argv: str) -> None:
    """scontrol on the local Slurm, as clustermgtd runs it on the head node."""
    layout = local_stack.load_layout(create=False)
    local_stack.run(["scontrol", *argv], env=layout.slurm_env())


def carve_partitions(queues: list[str], short: str | list[str], code: str = "InsufficientInstanceCapacity") -> dict:
    """STAND-IN for a cluster some of whose queues cannot launch their nodes: each queue becomes a Slurm partition
    of its own, as ParallelCluster makes them (the first the default), of the local nodes: the short queues one
    node, the other queues the rest (ParallelCluster's queues have nodes of their own; here they share what is
    left). That node goes DOWN with slurm_resume's reason, `(Code:<code>)Failure when resuming nodes`: what
    ParallelCluster's nodes show when EC2 answers an insufficient-capacity error (its fast fail-over)."""
    nodes = [name for name, _ in local_nodes()]
    shorts = [short] if isinstance(short, str) else list(short)
    if len(nodes) < 2 or not shorts or not set(shorts) <= set(queues) or set(shorts) == set(queues):
        raise SystemExit(
            f"{ICE_ENV}: short queue(s) {shorts} of {queues}, with {len(nodes)} local nodes: needs some of the "
            "queues (not all) and 2 nodes or more"
        )
    first, rest = nodes[:1], nodes[1:]
    carved = {queue: first if queue in shorts else rest for queue in queues}
    for index, (queue, members) in enumerate(carved.items()):
        default = "YES" if index == 0 else "NO"
        slurm("create", f"PartitionName={queue}", f"Nodes={','.join(members)}", "State=UP", f"Default={default}")
    slurm("update", f"NodeName={','.join(first)}", "State=DOWN", f"Reason=(Code:{code})Failure when resuming nodes")
    return carved


def short_queues(ec2, config: dict, shortage: str) -> list[str]:
    """The queues `<type>@<zone>[,<type>@<zone>...]` leaves without capacity, as EC2 Fleet would: those each of
    whose instance types is short in the zone of the queue's subnet (the zone asked of EC2: the subnet's)."""
    short = {tuple(item.strip().split("@", 1)) for item in shortage.split(",") if item.strip()}
    found = []
    for queue in config["Scheduling"]["SlurmQueues"]:
        subnet_id = queue["Networking"]["SubnetIds"][0]
        zone = ec2.describe_subnets(SubnetIds=[subnet_id])["Subnets"][0]["AvailabilityZone"]
        types = [kind for resource in queue["ComputeResources"] for kind in resource_types(resource)]
        if types and all((kind, zone) in short for kind in types):
            found.append(queue["Name"])
    return found


def release_partitions(queues: list[str]) -> None:
    """Undo `carve_partitions` when the cluster is deleted: its partitions gone, the local one the default
    again, the short node back up."""
    for queue in queues:
        slurm("delete", f"PartitionName={queue}")
    slurm("update", f"PartitionName={LOCAL_PARTITION}", "Default=YES")
    layout = local_stack.load_layout(create=False)
    listed = local_stack.run(["sinfo", "-h", "-N", "-t", "down", "-o", "%N|%E"], env=layout.slurm_env()).stdout
    short = sorted({line.split("|")[0] for line in listed.splitlines() if "|(Code:" in line})
    if short:
        slurm("update", f"NodeName={','.join(short)}", "State=RESUME")


# -- the compute fleet: its status in pcluster's table (item COMPUTE_FLEET, as pcluster 3.2+ stores it) --

FLEET_KEY = {"Id": {"S": "COMPUTE_FLEET"}}
#: What clustermgtd on the head node makes of a request (within a minute on AWS; here at the next look).
SETTLES_TO = {"STOP_REQUESTED": "STOPPED", "STOPPING": "STOPPED", "START_REQUESTED": "RUNNING", "STARTING": "RUNNING"}


def put_fleet(ddb, name: str, status: str) -> dict:
    """The head node's write of the fleet's status (the first once it is up, then clustermgtd's)."""
    now = dt.datetime.now(dt.UTC).isoformat(sep=" ")  # str(datetime.now(tz=timezone.utc)), as pcluster writes it
    data = {"status": {"S": status}, "lastStatusUpdatedTime": {"S": now}}
    with acting_as(BY_THE_CLUSTER):
        ddb.put_item(TableName=f"parallelcluster-{name}", Item={**FLEET_KEY, "Data": {"M": data}})
    return {"status": status, "lastStatusUpdatedTime": now}


def request_fleet(ddb, name: str, status: str) -> dict:
    """The CLI's request (update-compute-fleet): pcluster's ComputeFleetStatusManager updates the item."""
    now = dt.datetime.now(dt.UTC).isoformat(sep=" ")
    ddb.update_item(
        TableName=f"parallelcluster-{name}",
        Key=FLEET_KEY,
        UpdateExpression="set #dt.#st=:s, #dt.#lut=:t",
        ExpressionAttributeNames={"#dt": "Data", "#st": "status", "#lut": "lastStatusUpdatedTime"},
        ExpressionAttributeValues={":s": {"S": status}, ":t": {"S": now}},
    )
    return {"status": status, "lastStatusUpdatedTime": now}


def fleet(ddb, name: str) -> dict:
    """The fleet's status, after clustermgtd has acted on a pending request."""
    item = ddb.get_item(TableName=f"parallelcluster-{name}", Key=FLEET_KEY).get("Item")
    if item is None:
        return {"status": "UNKNOWN", "lastStatusUpdatedTime": None}
    data = {k: v["S"] for k, v in item["Data"]["M"].items()}
    if data["status"] in SETTLES_TO:
        return put_fleet(ddb, name, SETTLES_TO[data["status"]])
    return data


def fleet_answer(data: dict) -> dict:
    """describe/update-compute-fleet's JSON: the time in UTC ISO 8601 with milliseconds."""
    when = data["lastStatusUpdatedTime"]
    if when:
        when = dt.datetime.fromisoformat(when).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return {"status": data["status"], "lastStatusUpdatedTime": when}


def update_fleet(ddb, name: str, requested: str) -> dict:
    """pcluster's Cluster.start()/stop(): a request unless the fleet is already there or on its way."""
    if requested not in ("START_REQUESTED", "STOP_REQUESTED"):
        message = (
            "Bad Request: the update compute fleet status can only be set to `START_REQUESTED` or "
            "`STOP_REQUESTED` for Slurm scheduler clusters."
        )
        out({"message": message}, 1)
    current = fleet(ddb, name)
    stop = requested == "STOP_REQUESTED"
    going = {"STOP_REQUESTED", "STOPPING", "STOPPED"} if stop else {"START_REQUESTED", "STARTING", "RUNNING"}
    return current if current["status"] in going else request_fleet(ddb, name, requested)


def compute_fleet_command(cfn, ec2, args, region: str) -> None:
    """describe-compute-fleet, update-compute-fleet --status."""
    if stack_of(cfn, args.cluster_name) is None:
        not_found(args.cluster_name)
    ddb = boto3.client("dynamodb", region_name=region)
    if args.command == "describe-compute-fleet":
        out(fleet_answer(fleet(ddb, args.cluster_name)))
    out(fleet_answer(update_fleet(ddb, args.cluster_name, args.status)))


# -- the commands -----------------------------------------------------------------------------------


def create(cfn, ec2, args, region: str) -> None:
    name = args.cluster_name
    if stack_of(cfn, name):
        out({"message": f"Bad Request: Cluster '{name}' already exists."}, 1)
    config = yaml.safe_load(Path(args.cluster_configuration).read_text())
    tags = [{"Key": t["Key"], "Value": t["Value"]} for t in config.get("Tags", [])]
    stack_tags = [*tags, {"Key": "parallelcluster:version", "Value": VERSION}]
    failure = os.environ.get("PCFLOW_STANDIN_FAIL") or scripts_failure(config, region)
    if failure:
        stack_tags.append({"Key": FAIL_TAG, "Value": failure})
    queues = [q["Name"] for q in config["Scheduling"]["SlurmQueues"]]
    if os.environ.get(ICE_ENV):  # the nodes pcflow's train wait sees, as clustermgtd leaves them
        short, _, code = os.environ[ICE_ENV].partition(":")
        carve_partitions(queues, short_queues(ec2, config, short) if "@" in short else short, code or ICE_CODE)
        stack_tags.append({"Key": ICE_TAG, "Value": ",".join(queues)})
    arn = cfn.create_stack(
        StackName=name,
        TemplateBody=template_for(config, name, tags),
        Tags=stack_tags,
        DisableRollback=args.rollback_on_failure == "false",
    )["StackId"]
    with acting_as(BY_THE_CLUSTER):  # Slurm's nodes, not the stack's: the head node launches them
        for node in compute_fleet(config):
            launch(ec2, config, name, tags, node)
    put_fleet(boto3.client("dynamodb", region_name=region), name, "RUNNING")  # what the head node writes once up
    out({"cluster": summary(name, region, "CREATE_IN_PROGRESS", arn), "validationMessages": []})


def node_scripts(config: dict) -> list[tuple[str, list[dict]]]:
    """The OnNodeConfigured scripts of the head node and of each queue, each with the S3Access of the
    nodes that run it (their role's only S3 rights beside ParallelCluster's own bucket)."""
    holders = [config.get("HeadNode") or {}, *((config.get("Scheduling") or {}).get("SlurmQueues") or [])]
    found = []
    for holder in holders:
        action = (holder.get("CustomActions") or {}).get("OnNodeConfigured") or {}
        access = (holder.get("Iam") or {}).get("S3Access") or []
        found += [(step["Script"], access) for step in action.get("Sequence") or [action] if step.get("Script")]
    return found


def readable(bucket: str, key: str, access: list[dict]) -> bool:
    """Whether an S3Access list lets a node role read the object (ParallelCluster grants
    `arn:aws:s3:::<BucketName>/<KeyName or *>`, wildcards as IAM matches them)."""
    return any(
        entry.get("BucketName") == bucket and fnmatch.fnmatchcase(key, entry.get("KeyName") or "*") for entry in access
    )


def scripts_failure(config: dict, region: str) -> str | None:
    """What the nodes' download of their scripts makes of the cluster: a failure code, or None when each
    node could read each of its scripts with its role (S3Access), the call made as the cluster's."""
    s3 = boto3.client("s3", region_name=region)
    for uri, access in node_scripts(config):
        if not uri.startswith("s3://"):
            continue  # an https:// script: the nodes fetch it with no AWS call
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        if not readable(bucket, key, access):
            print(f"pcluster stand-in: no S3Access of the nodes covers {uri}: AccessDenied", file=sys.stderr)
            return "OnNodeConfiguredDownloadFailure"
        try:
            with acting_as(BY_THE_CLUSTER):
                s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        except ClientError as error:
            print(f"pcluster stand-in: a node could not download {uri}: {error}", file=sys.stderr)
            return "OnNodeConfiguredDownloadFailure"
    return None


def summary(name: str, region: str, status: str, arn: str) -> dict:
    """The `cluster` of pcluster's create and update answers."""
    return {
        "clusterName": name,
        "region": region,
        "version": VERSION,
        "clusterStatus": status,
        "cloudformationStackStatus": status,
        "cloudformationStackArn": arn,
        "scheduler": {"type": "slurm"},
    }


def describe(cfn, ec2, args, region: str) -> None:
    name = args.cluster_name
    stack = stack_of(cfn, name)
    if stack is None:
        not_found(name)
    tags = {t["Key"]: t["Value"] for t in stack.get("Tags", [])}
    status = stack["StackStatus"]
    described = {
        "creationTime": iso(stack["CreationTime"]),
        "version": tags.get("parallelcluster:version", VERSION),
        "clusterConfiguration": {"url": "NOT_AVAILABLE"},
        "tags": [{"value": v, "key": k} for k, v in tags.items() if k != FAIL_TAG],
        "cloudFormationStackStatus": status,
        "clusterName": name,
        "computeFleetStatus": fleet(boto3.client("dynamodb", region_name=region), name)["status"],
        "cloudformationStackArn": stack["StackId"],
        "lastUpdatedTime": iso(stack.get("LastUpdatedTime") or stack["CreationTime"]),
        "region": region,
        "clusterStatus": status,
        "scheduler": {"type": "slurm"},
    }
    if FAIL_TAG in tags:
        described["clusterStatus"] = described["cloudFormationStackStatus"] = "CREATE_FAILED"
        described["computeFleetStatus"] = "UNKNOWN"
        reason = FAILURE_REASONS.get(tags[FAIL_TAG], "Failed to run cluster configuration.")
        failure = {"failureCode": tags[FAIL_TAG], "failureReason": reason}
        described["failures"] = [failure]
    heads = cluster_instances(ec2, name, "HeadNode")
    if heads:
        # The local head node has booted: its console shows its host keys, as cloud-init prints them.
        set_console_output(heads[0]["InstanceId"], console_output(local_host_key()))
        described["headNode"] = instance_json(heads[0])
    out(described)


def instance_json(instance: dict) -> dict:
    """An instance as pcluster's EC2Instance / ClusterInstance prints it, with the local node's address."""
    node_type = "HeadNode" if tag_of(instance, "parallelcluster:node-type") == "HeadNode" else "ComputeNode"
    answer = {
        "launchTime": iso(instance["LaunchTime"]),
        "instanceId": instance["InstanceId"],
        "instanceType": instance["InstanceType"],
        "state": instance["State"]["Name"],
        "privateIpAddress": instance.get("PrivateIpAddress"),
    }
    if node_type == "HeadNode":
        answer["publicIpAddress"] = HEAD_NODE_ADDRESS  # the local head node, which EC2 here cannot give
        return answer
    addresses = dict(local_nodes())
    answer.update(nodeType=node_type, queueName=tag_of(instance, "parallelcluster:queue-name"))
    answer["privateIpAddress"] = addresses.get(tag_of(instance, NODE_TAG) or "", answer["privateIpAddress"])
    return answer


def describe_instances(cfn, ec2, args, region: str) -> None:
    name = args.cluster_name
    if stack_of(cfn, name) is None:
        not_found(name)
    wanted = {"HeadNode": "HeadNode", "ComputeNode": "Compute"}.get(args.node_type or "")
    instances = []
    for instance in cluster_instances(ec2, name, wanted):
        if args.queue_name and tag_of(instance, "parallelcluster:queue-name") != args.queue_name:
            continue
        answer = instance_json(instance)
        answer.setdefault("nodeType", "HeadNode")
        instances.append(answer)
    out({"instances": instances})


def update(cfn, ec2, args, region: str) -> None:
    name = args.cluster_name
    stack = stack_of(cfn, name)
    if stack is None:
        not_found(name)
    body = cfn.get_template(StackName=name)["TemplateBody"]  # boto3 parses JSON bodies, moto may not
    template = json.loads(body) if isinstance(body, str) else body
    old = template["Metadata"]["ClusterConfig"]
    new = yaml.safe_load(Path(args.cluster_configuration).read_text())
    change_set = changes(old, new)
    refused = [
        {**c, "message": "Update actions are not currently supported for this parameter"}
        for c in change_set
        if not c["parameter"].startswith(UPDATABLE)
    ]
    if refused:
        out({"message": "Update failure", "updateValidationErrors": refused, "changeSet": change_set}, 1)
    if args.dryrun == "true":
        out({"message": "Request would have succeeded, but DryRun flag is set.", "changeSet": change_set}, 1)
    tags = [{"Key": t["Key"], "Value": t["Value"]} for t in new.get("Tags", [])]
    template["Metadata"]["ClusterConfig"] = new  # the resources stay: queue sizes and tags only
    tags.append({"Key": "parallelcluster:version", "Value": VERSION})
    cfn.update_stack(StackName=name, TemplateBody=json.dumps(template), Tags=tags)
    out({"cluster": summary(name, region, "UPDATE_IN_PROGRESS", stack["StackId"]), "changeSet": change_set})


def delete(cfn, ec2, args, region: str) -> None:
    name = args.cluster_name
    if stack_of(cfn, name) is None:
        hint = " In case you have running instances belonging to a deleted cluster please use the "
        not_found(name, hint + "DeleteClusterInstances API.")
    tags = {t["Key"]: t["Value"] for t in (stack_of(cfn, name) or {}).get("Tags", [])}
    if tags.get(ICE_TAG):
        release_partitions(tags[ICE_TAG].split(","))
    instances = cluster_instances(ec2, name)
    if instances:  # the stack's cleanup on deletion (a function with a cluster role) terminates the nodes
        with acting_as(BY_THE_CLUSTER):
            ec2.terminate_instances(InstanceIds=[i["InstanceId"] for i in instances])
    cfn.delete_stack(StackName=name)
    status = "DELETE_IN_PROGRESS"
    deleting = {"clusterName": name, "clusterStatus": status, "cloudformationStackStatus": status, "version": VERSION}
    out({"cluster": deleting})


COMMANDS = {
    "create-cluster": create,
    "describe-cluster": describe,
    "describe-cluster-instances": describe_instances,
    "update-cluster": update,
    "delete-cluster": delete,
    "describe-compute-fleet": compute_fleet_command,
    "update-compute-fleet": compute_fleet_command,
}


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="pcluster")
    parser.add_argument("command")
    parser.add_argument("--cluster-name", "-n")
    parser.add_argument("--cluster-configuration", "-c")
    parser.add_argument("--region", "-r")
    parser.add_argument("--dryrun", default="false")
    parser.add_argument("--rollback-on-failure", default="true")
    parser.add_argument("--validation-failure-level")
    parser.add_argument("--suppress-validators", nargs="*")
    parser.add_argument("--node-type")
    parser.add_argument("--queue-name")
    parser.add_argument("--status")
    return parser.parse_args(argv)


def main() -> None:
    args = parse(sys.argv[1:])
    if args.command not in EMULATED or (args.command == "create-cluster" and args.dryrun == "true"):
        run_real_cli()  # ParallelCluster's own validators, version, and all the rest
    if not on_the_emulator():
        why = "the pcluster stand-in answers only the local stack's emulator (AWS_ENDPOINT_URL on loopback)"
        out({"message": f"{why}; against AWS use the real CLI (PCFLOW_PCLUSTER or .venv-pcluster/bin/pcluster)"}, 2)
    region = args.region or os.environ.get("AWS_DEFAULT_REGION")
    cfn = boto3.client("cloudformation", region_name=region)
    ec2 = boto3.client("ec2", region_name=region)
    COMMANDS[args.command](cfn, ec2, args, region)


if __name__ == "__main__":
    main()
