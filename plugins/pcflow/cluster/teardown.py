"""The teardown loop's handler for ParallelCluster clusters: CloudFormation stacks carrying pcflow's
tags (pcluster copies the config's Tags onto its stack) and ParallelCluster's version tag.

Deleting the stack does what `pcluster delete-cluster` does: compute nodes launched by Slurm at runtime
(not by CloudFormation) are terminated first, then the stack is deleted. Registered as handler set
"pcluster"; importing this module registers it, so whoever asks for "pcluster" imports this module
(pcflow.aws, below, knows the set only by name: the pipeline, the `janitor` DAG, the UI and the alerts
import it).
"""

from __future__ import annotations

from typing import Any

from pcflow.aws.teardown.handlers import ListByTagHandler, paginate
from pcflow.aws.teardown.model import Resource, Selector
from pcflow.aws.teardown.registry import register_handlers, registered_handler_sets

TAG_PCLUSTER_VERSION = "parallelcluster:version"
TAG_PCLUSTER_NAME = "parallelcluster:cluster-name"
HANDLER_SET = "pcluster"


class ParallelClusterStackHandler(ListByTagHandler):
    """ParallelCluster clusters, as their CloudFormation stacks; deleted before the network, since the cluster
    sits in its subnets."""

    kind, order = "pcluster-cluster", 5  # before the network: the cluster sits in its subnets
    operation, result_key, id_key, state_key = "describe_stacks", "Stacks", "StackName", "StackStatus"

    def __init__(self, cloudformation: Any, ec2: Any):
        super().__init__(cloudformation)
        self.ec2 = ec2

    def arguments(self, selector: Selector) -> dict[str, Any]:
        return {}  # CloudFormation has no tag filter: the selector decides on each stack's tags

    def selects(self, selector: Selector, item: dict[str, Any], tags: dict[str, str]) -> bool:
        return TAG_PCLUSTER_VERSION in tags and selector.matches(tags) and item["StackStatus"] != "DELETE_COMPLETE"

    def delete(self, resource: Resource) -> None:
        """Terminate the compute nodes Slurm launched (CloudFormation does not know them), then delete the
        stack, unless its deletion is under way."""
        filters = [
            {"Name": f"tag:{TAG_PCLUSTER_NAME}", "Values": [resource.id]},
            {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]},
        ]
        ids = [
            i["InstanceId"]
            for r in paginate(self.ec2, "describe_instances", "Reservations", Filters=filters)
            for i in r["Instances"]
        ]
        if ids:
            self.ec2.terminate_instances(InstanceIds=ids)
        if resource.state != "DELETE_IN_PROGRESS":
            self.client.delete_stack(StackName=resource.id)


if HANDLER_SET not in registered_handler_sets():
    register_handlers(
        HANDLER_SET, lambda clients: [ParallelClusterStackHandler(clients("cloudformation"), clients("ec2"))]
    )
