"""The base of pcflow's AWS operators: the Amazon provider's connection settings, retrying clients per service.

The arguments and template fields are those of the provider's `AwsBaseOperator` (conn id, region,
verify, botocore config), but the hook is imported when a task first needs it: subclassing
`AwsBaseOperator` would load boto3 (about 0.4 s) whenever a DAG file declaring one of these operators
is parsed.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any

from airflow.sdk import BaseOperator

from pcflow.aws.clients import client_from_hook, retry_botocore_config


class PcflowAwsOperator(BaseOperator):
    """Connection handling (conn id, region, verify, botocore config) goes through the provider's hooks;
    every client this operator makes uses a standard/adaptive retry mode."""

    template_fields: Sequence[str] = ("aws_conn_id", "region_name", "verify")

    def __init__(
        self,
        *,
        aws_conn_id: str | None = "aws_default",
        region_name: str | None = None,
        verify: bool | str | None = None,
        botocore_config: dict | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.aws_conn_id = aws_conn_id
        self.region_name = region_name
        self.verify = verify
        self.botocore_config = botocore_config

    @property
    def _hook_parameters(self) -> dict[str, Any]:
        """What every provider hook takes: the connection, region, TLS verification, botocore config."""
        return {
            "aws_conn_id": self.aws_conn_id,
            "region_name": self.region_name,
            "verify": self.verify,
            "config": self.botocore_config,
        }

    @cached_property
    def hook(self) -> Any:
        """The connection's EC2 hook (region from the connection when the task sets none)."""
        from airflow.providers.amazon.aws.hooks.ec2 import EC2Hook

        return EC2Hook(api_type="client_type", **self._hook_parameters)

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
