#!/usr/bin/env python3
"""STAND-IN for the `pcluster` CLI's create/describe/update/delete-cluster (create: no dry runs).

Why: a real `pcluster create-cluster` synthesises its template with CDK and then moto's CloudFormation
refuses it ("Missing parameter ConfigVersion", see probes.md), so no real cluster can be made on the
emulator. This script follows pcluster 3.16's documented JSON output (describeCluster / createCluster /
deleteCluster response syntax, "Cluster 'X' does not exist ..." message, exit code 1 on errors) and does
the AWS side for real against the moto server: a CloudFormation stack named after the cluster carrying
the config's Tags plus `parallelcluster:version`, and a head-node EC2 instance tagged like pcluster's.
update-cluster follows pcluster's controller (DryrunOperationException's message and changeSet;
UpdateClusterBadRequestException's "Update failure" with updateValidationErrors), with a simplified
update policy: queue sizes and tags update in place, anything else is refused as UNSUPPORTED.
`PCFLOW_STANDIN_FAIL=<failureCode>` at create time makes describe-cluster report CREATE_FAILED with that
code, as pcluster does after a failed head-node wait condition.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import boto3
import yaml

VERSION = "3.16.1"
FAIL_TAG = "pcflow-standin:fail"
#: Settings the stand-in updates in place (pcluster: RESIZE_UPDATE_STRATEGY_ON_REMOVE / SUPPORTED).
UPDATABLE = ("Scheduling.SlurmQueues.", "Tags")


def template_for(config: dict) -> str:
    """The stack remembers the cluster's config (as pcluster keeps it in its S3 bucket), for updates."""
    resources = {"HeadNodeWaitConditionHandle": {"Type": "AWS::CloudFormation::WaitConditionHandle"}}
    return json.dumps({"Metadata": {"ClusterConfig": config}, "Resources": resources})


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


def out(payload: dict, code: int = 0) -> None:
    print(json.dumps(payload, indent=2))
    sys.exit(code)


def not_found(name: str) -> None:
    out({"message": f"Cluster '{name}' does not exist or belongs to an incompatible ParallelCluster major version."}, 1)


def stack_of(cfn, name: str) -> dict | None:
    try:
        return cfn.describe_stacks(StackName=name)["Stacks"][0]
    except Exception:
        return None


def head_node(ec2, name: str) -> dict | None:
    filters = [
        {"Name": "tag:parallelcluster:cluster-name", "Values": [name]},
        {"Name": "tag:parallelcluster:node-type", "Values": ["HeadNode"]},
        {"Name": "instance-state-name", "Values": ["pending", "running"]},
    ]
    for reservation in ec2.describe_instances(Filters=filters)["Reservations"]:
        for instance in reservation["Instances"]:
            return instance
    return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command")
    parser.add_argument("--cluster-name", "-n")
    parser.add_argument("--cluster-configuration", "-c")
    parser.add_argument("--region", "-r")
    parser.add_argument("--dryrun", default="false")
    parser.add_argument("--rollback-on-failure", default="true")
    parser.add_argument("--validation-failure-level")
    parser.add_argument("--suppress-validators", nargs="*")
    args = parser.parse_args()
    region = args.region or os.environ.get("AWS_DEFAULT_REGION")
    cfn = boto3.client("cloudformation", region_name=region)
    ec2 = boto3.client("ec2", region_name=region)
    name = args.cluster_name
    if args.command == "version":
        out({"version": VERSION})
    if args.command == "create-cluster":
        if args.dryrun == "true":
            out({"message": "the stand-in does not dry-run: use the real pcluster"}, 2)
        if stack_of(cfn, name):
            out({"message": f"Bad Request: Cluster '{name}' already exists."}, 1)
        config = yaml.safe_load(open(args.cluster_configuration))
        tags = [{"Key": t["Key"], "Value": t["Value"]} for t in config.get("Tags", [])]
        tags.append({"Key": "parallelcluster:version", "Value": VERSION})
        if os.environ.get("PCFLOW_STANDIN_FAIL"):
            tags.append({"Key": FAIL_TAG, "Value": os.environ["PCFLOW_STANDIN_FAIL"]})
        arn = cfn.create_stack(
            StackName=name,
            TemplateBody=template_for(config),
            Tags=tags,
            DisableRollback=args.rollback_on_failure == "false",
        )["StackId"]
        image = config["Image"].get("CustomAmi") or "ami-12c6146b"
        ec2.run_instances(
            ImageId=image,
            MinCount=1,
            MaxCount=1,
            InstanceType=config["HeadNode"]["InstanceType"],
            SubnetId=config["HeadNode"]["Networking"]["SubnetId"],
            TagSpecifications=[
                {
                    "ResourceType": "instance",
                    "Tags": [
                        {"Key": "parallelcluster:cluster-name", "Value": name},
                        {"Key": "parallelcluster:node-type", "Value": "HeadNode"},
                        *[t for t in tags if t["Key"].startswith("pcflow:")],
                    ],
                }
            ],
        )
        out(
            {
                "cluster": {
                    "clusterName": name,
                    "region": region,
                    "version": VERSION,
                    "clusterStatus": "CREATE_IN_PROGRESS",
                    "cloudformationStackStatus": "CREATE_IN_PROGRESS",
                    "cloudformationStackArn": arn,
                    "scheduler": {"type": "slurm"},
                },
                "validationMessages": [],
            }
        )
    if args.command == "describe-cluster":
        stack = stack_of(cfn, name)
        if stack is None:
            not_found(name)
        tags = {t["Key"]: t["Value"] for t in stack.get("Tags", [])}
        status = stack["StackStatus"]
        failures = []
        if FAIL_TAG in tags:
            status = "CREATE_FAILED"
            failures = [{"failureCode": tags[FAIL_TAG], "failureReason": "Failed to run cluster configuration."}]
        head = head_node(ec2, name)
        described = {
            "clusterName": name,
            "region": region,
            "version": VERSION,
            "cloudFormationStackStatus": status,
            "clusterStatus": status,
            "scheduler": {"type": "slurm"},
            "cloudformationStackArn": stack["StackId"],
            "computeFleetStatus": "RUNNING" if status == "CREATE_COMPLETE" else "UNKNOWN",
            "tags": [{"key": k, "value": v} for k, v in tags.items() if k != FAIL_TAG],
        }
        if head:
            described["headNode"] = {
                "instanceId": head["InstanceId"],
                "instanceType": head["InstanceType"],
                "privateIpAddress": head.get("PrivateIpAddress"),
                "publicIpAddress": head.get("PublicIpAddress"),
                "state": head["State"]["Name"],
            }
        if failures:
            described["failures"] = failures
        out(described)
    if args.command == "update-cluster":
        stack = stack_of(cfn, name)
        if stack is None:
            not_found(name)
        body = cfn.get_template(StackName=name)["TemplateBody"]  # boto3 parses JSON bodies, moto may not
        old = (json.loads(body) if isinstance(body, str) else body)["Metadata"]["ClusterConfig"]
        new = yaml.safe_load(open(args.cluster_configuration))
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
        tags.append({"Key": "parallelcluster:version", "Value": VERSION})
        cfn.update_stack(StackName=name, TemplateBody=template_for(new), Tags=tags)
        out({"cluster": {"clusterName": name, "region": region, "version": VERSION,
                         "clusterStatus": "UPDATE_IN_PROGRESS", "cloudformationStackStatus": "UPDATE_IN_PROGRESS",
                         "cloudformationStackArn": stack["StackId"], "scheduler": {"type": "slurm"}},
             "changeSet": change_set})  # fmt: skip
    if args.command == "delete-cluster":
        stack = stack_of(cfn, name)
        if stack is None:
            out({"message": f"Cluster '{name}' does not exist or belongs to an incompatible ParallelCluster major "
                 "version. In case you have running instances belonging to a deleted cluster please use the "
                 "DeleteClusterInstances API."}, 1)  # fmt: skip
        head = head_node(ec2, name)
        if head:
            ec2.terminate_instances(InstanceIds=[head["InstanceId"]])
        cfn.delete_stack(StackName=name)
        out({"cluster": {"clusterName": name, "clusterStatus": "DELETE_IN_PROGRESS",
                         "cloudformationStackStatus": "DELETE_IN_PROGRESS", "version": VERSION}})  # fmt: skip
    out({"message": f"the stand-in does not implement {args.command}"}, 2)


if __name__ == "__main__":
    main()
