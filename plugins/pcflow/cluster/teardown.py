"""The teardown loop's handler for ParallelCluster clusters: CloudFormation stacks carrying pcflow's
tags (pcluster copies the config's Tags onto its stack) and ParallelCluster's version tag.

Deleting the stack does what `pcluster delete-cluster` does: compute nodes launched by Slurm at runtime
(not by CloudFormation) are terminated first, then the stack is deleted. Registered as handler set
"pcluster"; importing this module registers it.
"""

from __future__ import annotations

from typing import Any

from pcflow.aws.tags import tag_dict
from pcflow.aws.teardown import Handler, Resource, Selector, _paginate, register_handlers, registered_handler_sets

TAG_PCLUSTER_VERSION = "parallelcluster:version"
TAG_PCLUSTER_NAME = "parallelcluster:cluster-name"
HANDLER_SET = "pcluster"


class ParallelClusterStackHandler(Handler):
    kind, order = "pcluster-cluster", 5  # before the network: the cluster sits in its subnets

    def __init__(self, cloudformation: Any, ec2: Any):
        self.cfn = cloudformation
        self.ec2 = ec2

    def list(self, selector: Selector) -> list[Resource]:
        out = []
        for stack in _paginate(self.cfn, "describe_stacks", "Stacks"):
            tags = tag_dict(stack.get("Tags"))
            if TAG_PCLUSTER_VERSION in tags and selector.matches(tags) and stack["StackStatus"] != "DELETE_COMPLETE":
                out.append(Resource(self.kind, stack["StackName"], tags, stack["StackStatus"]))
        return out

    def delete(self, resource: Resource) -> None:
        filters = [
            {"Name": f"tag:{TAG_PCLUSTER_NAME}", "Values": [resource.id]},
            {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]},
        ]
        ids = [
            i["InstanceId"]
            for r in _paginate(self.ec2, "describe_instances", "Reservations", Filters=filters)
            for i in r["Instances"]
        ]
        if ids:
            self.ec2.terminate_instances(InstanceIds=ids)
        if resource.state != "DELETE_IN_PROGRESS":
            self.cfn.delete_stack(StackName=resource.id)


if HANDLER_SET not in registered_handler_sets():
    register_handlers(
        HANDLER_SET, lambda clients: [ParallelClusterStackHandler(clients("cloudformation"), clients("ec2"))]
    )
