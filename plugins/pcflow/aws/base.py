"""The base of every pcflow operator that calls AWS: the Amazon provider's `AwsBaseOperator` contract
(`aws_conn_id`, `region_name`, `verify`, `botocore_config`; template fields from `aws_template_fields`;
a cached hook built from `_hook_parameters`), with retrying clients of any service on the same
connection.

The contract is the provider's, its code is not imported here: `airflow.providers.amazon.aws.operators.
base_aws` (and even its `utils.mixins`) loads boto3 and the provider's hooks, and a DAG file declaring
one of these operators must parse without them (tests/dags/test_parse.py). The hook is imported when a
task first uses it; tests/pcflow/aws/test_base.py holds this base to the provider's signature, template
fields and hook parameters, so a provider change shows up as a failing test.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache, cached_property
from typing import Any, NoReturn

from airflow.sdk import BaseOperator

from pcflow.aws.clients import DEFAULT_AWS_CONN_ID, client_from_hook, retry_botocore_config
from pcflow.aws.locks import Holding, S3Lock

#: What the provider's `aws_template_fields` adds to every AWS operator's template fields.
AWS_TEMPLATE_FIELDS = ("aws_conn_id", "region_name", "verify")


@cache
def aws_template_fields(*template_fields: str) -> tuple[str, ...]:
    """The provider's helper: the operator's own fields and the connection's, sorted."""
    return tuple(sorted({*AWS_TEMPLATE_FIELDS, *template_fields}))


class PcflowAwsOperator(BaseOperator):
    """An operator on one AWS connection: the provider's EC2 hook (`hook`), and retrying clients of other
    services (`client(service)`), all with the task's region, TLS verification and botocore config.

    :param aws_conn_id: The Airflow connection used for AWS credentials (and, for the local stack, the
        endpoint). If this is None or empty then the default boto3 behaviour is used.
    :param region_name: AWS region_name. If not specified then the connection's region is used.
    :param verify: Whether or not to verify SSL certificates, or the path of a CA bundle. See:
        https://boto3.amazonaws.com/v1/documentation/api/latest/reference/core/session.html
    :param botocore_config: Configuration dictionary (key-values) for botocore client; its retry mode is
        raised to `standard` unless it sets `standard` or `adaptive`. See:
        https://botocore.amazonaws.com/v1/documentation/api/latest/reference/config.html
    """

    template_fields: Sequence[str] = aws_template_fields()

    def __init__(
        self,
        *,
        aws_conn_id: str | None = DEFAULT_AWS_CONN_ID,
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
        """The connection's EC2 hook, made once per task (an operator on another service overrides this,
        building that service's hook from `_hook_parameters`)."""
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
    def aws_connection(self) -> dict[str, Any]:
        """The connection settings as keyword arguments, for what makes its own clients (the cluster
        providers): the same four an operator takes."""
        return {
            "aws_conn_id": self.aws_conn_id,
            "region_name": self.region_name,
            "verify": self.verify,
            "botocore_config": self.botocore_config,
        }

    @property
    def trigger_aws_kwargs(self) -> dict[str, Any]:
        """What a trigger needs to rebuild the same connection in the triggerer, retry mode included."""
        return {
            "aws_conn_id": self.aws_conn_id,
            "region_name": self.hook.region_name,
            "verify": self.verify,
            "botocore_config": retry_botocore_config(self.botocore_config),
        }

    def defer_on_lock(self, lock: S3Lock, found: Holding, *, method_name: str, waiter_delay: int) -> NoReturn:
        """Wait for a lock another run holds in the triggerer, not in a worker slot; `method_name` is called
        once the lock is released (or changed hands) and tries again."""
        self.log.info("%s: held by run %s since %s; deferred until released", lock.why, found.holder, found.since)
        self.defer(
            trigger=lock.released_trigger(found, waiter_delay=waiter_delay, **self.trigger_aws_kwargs),
            method_name=method_name,
        )
        raise AssertionError("unreachable: defer raises")  # pragma: no cover
