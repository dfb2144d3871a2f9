"""Deferrable wait on a ParallelCluster cluster's CloudFormation stack (the stack is named after the
cluster), with the Amazon provider's waiter trigger and botocore's CloudFormation waiters."""

from __future__ import annotations

from typing import Any

from airflow.providers.amazon.aws.hooks.cloud_formation import CloudFormationHook
from airflow.providers.amazon.aws.triggers.base import AwsBaseWaiterTrigger

STACK_WAITERS = ("stack_create_complete", "stack_update_complete", "stack_delete_complete")


class ClusterStackTrigger(AwsBaseWaiterTrigger):
    """Fires when the stack reaches the waiter's goal (or fails); logs the stack status on every poll."""

    aws_hook_class = CloudFormationHook

    def __init__(
        self,
        *,
        stack_name: str,
        waiter_name: str,
        waiter_delay: int = 30,
        waiter_max_attempts: int = 240,
        **connection: Any,
    ):
        if waiter_name not in STACK_WAITERS:
            raise ValueError(f"waiter_name must be one of {STACK_WAITERS}, not {waiter_name!r}")
        super().__init__(
            serialized_fields={"stack_name": stack_name, "waiter_name": waiter_name},
            waiter_name=waiter_name,
            waiter_args={"StackName": stack_name},
            failure_message=f"cluster stack {stack_name} did not reach the goal of {waiter_name}",
            status_message=f"cluster stack {stack_name}",
            status_queries=["Stacks[0].StackStatus", "Stacks[0].StackStatusReason"],
            return_key="stack_name",
            return_value=stack_name,
            waiter_delay=waiter_delay,
            waiter_max_attempts=waiter_max_attempts,
            **connection,
        )
