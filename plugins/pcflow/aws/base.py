"""The base of pcflow's AWS operators: the provider's `AwsBaseOperator` plus retrying clients per service."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from airflow.providers.amazon.aws.hooks.ec2 import EC2Hook
from airflow.providers.amazon.aws.operators.base_aws import AwsBaseOperator

from pcflow.aws.clients import client_from_hook, retry_botocore_config


class PcflowAwsOperator(AwsBaseOperator[EC2Hook]):
    """Connection handling (conn id, region, verify, botocore config) comes from the provider; every
    client this operator makes uses a standard/adaptive retry mode."""

    aws_hook_class = EC2Hook

    @property
    def _hook_parameters(self) -> dict[str, Any]:
        return {**super()._hook_parameters, "api_type": "client_type"}

    @cached_property
    def ec2(self) -> Any:
        return client_from_hook(self.hook)

    def client(self, service: str) -> Any:
        """A retrying client of another service on the same connection, made once per task."""
        cache = self.__dict__.setdefault("_pcflow_clients", {})
        if service not in cache:
            cache[service] = self.ec2 if service == "ec2" else client_from_hook(self.hook, service)
        return cache[service]

    @property
    def trigger_aws_kwargs(self) -> dict[str, Any]:
        """What a trigger needs to rebuild the same connection in the triggerer, retry mode included."""
        return {
            "aws_conn_id": self.aws_conn_id,
            "region_name": self.hook.region_name,
            "verify": self.verify,
            "botocore_config": retry_botocore_config(self.botocore_config),
        }
