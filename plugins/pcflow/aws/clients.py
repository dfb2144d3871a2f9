"""boto3 clients with an explicit retry mode, built from the Amazon provider's hooks.

botocore's default ("legacy") retry mode retries a narrow set of errors; "standard" also retries
throttling (`RequestLimitExceeded`, `ThrottlingException`, `SlowDown`) with capped, jittered backoff.
Every pcflow client goes through `with_retries`, so a retry policy is never forgotten.

boto3 and botocore are imported where they are used: operator modules import this one, and a DAG file
that declares an operator must parse without loading them.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pcflow.errors import ConfigurationError, ServiceFailed

if TYPE_CHECKING:
    from botocore.config import Config

#: The Airflow AWS connection pcflow uses when none is named: the Amazon provider's own default,
#: `AwsBaseHook.default_conn_name` (tests/pcflow/aws/test_clients.py holds the two equal). Spelled here,
#: not read from the provider, because loading its hook loads boto3 and a DAG file parses without it.
DEFAULT_AWS_CONN_ID = "aws_default"
RETRY_MODES = ("standard", "adaptive")
DEFAULT_RETRIES: dict[str, Any] = {"mode": "standard", "max_attempts": 10}

log = logging.getLogger(__name__)


def with_retries(config: Config | Mapping[str, Any] | None = None) -> Config:
    """`config` with a standard/adaptive retry mode; a mode already set to one of those is kept."""
    from botocore.config import Config

    if isinstance(config, Mapping):
        config = Config(**config)
    config = config or Config()
    retries = dict(config.retries or {})
    if retries.get("mode") not in RETRY_MODES:
        retries = {**DEFAULT_RETRIES, **{k: v for k, v in retries.items() if k != "mode"}}
    return config.merge(Config(retries=retries))


def retry_botocore_config(botocore_config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The dict form of `with_retries`, for the `botocore_config` a trigger serializes."""
    merged = dict(botocore_config or {})
    retries = dict(merged.get("retries") or {})
    if retries.get("mode") not in RETRY_MODES:
        retries = {**DEFAULT_RETRIES, **{k: v for k, v in retries.items() if k != "mode"}}
    merged["retries"] = retries
    return merged


def client_from_hook(hook: Any, service: str | None = None) -> Any:
    """A client of the hook's connection (endpoint, CA bundle, credentials) with the retry mode forced.

    `service` overrides the hook's own client type, so one connection serves EC2, SSM, S3 and FSx.
    """
    if service is None:
        return hook.get_client_type(region_name=hook.region_name, config=with_retries(hook.config))
    from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

    other = AwsBaseHook(
        aws_conn_id=hook.aws_conn_id,
        client_type=service,
        region_name=hook.region_name,
        verify=hook.verify,
        config=hook.config,
    )
    return other.get_client_type(region_name=other.region_name, config=with_retries(other.config))


def aws_client(
    service: str,
    *,
    aws_conn_id: str | None = DEFAULT_AWS_CONN_ID,
    region_name: str | None = None,
    verify: bool | str | None = None,
    botocore_config: Config | Mapping[str, Any] | None = None,
) -> Any:
    """A retrying client for `service` from an Airflow AWS connection (what tests and DAG callables use)."""
    from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
    from botocore.config import Config

    if isinstance(botocore_config, Mapping):
        botocore_config = Config(**botocore_config)
    hook = AwsBaseHook(
        aws_conn_id=aws_conn_id,
        client_type=service,
        region_name=region_name,
        verify=verify,
        config=botocore_config,
    )
    return client_from_hook(hook)


def error_code(error: BaseException) -> str:
    """The AWS error code of a ClientError (or of pcflow's own `AwsCallFailed`), else ''."""
    from botocore.exceptions import ClientError

    if isinstance(error, ClientError):
        return str(error.response.get("Error", {}).get("Code", ""))
    return str(getattr(error, "code", ""))


def error_message(error: BaseException) -> str:
    """The AWS error message of a ClientError, else the exception's text: for matching on ids AWS names in it."""
    from botocore.exceptions import ClientError

    if isinstance(error, ClientError):
        return str(error.response.get("Error", {}).get("Message", error))
    return str(error)


class ObjectTooLarge(ServiceFailed):
    """An S3 object larger than what pcflow ever writes there: not read, since a job or another writer
    may have replaced it (never read whole what pcflow did not bound)."""


def read_object(client: Any, *, bucket: str, key: str, limit: int, **request: Any) -> bytes:
    """An object's bytes, at most `limit` of them (one GET, the stream read to `limit` + 1); a larger
    object raises ObjectTooLarge. Errors of the GET (NoSuchKey...) reach the caller as they are."""
    with client.get_object(Bucket=bucket, Key=key, **request)["Body"] as body:
        data = body.read(limit + 1)
    if len(data) > limit:
        raise ObjectTooLarge(
            f"s3://{bucket}/{key} is larger than {limit:,} bytes, more than pcflow writes there: not read"
        )
    return data


class AwsCallFailed(ServiceFailed):
    """An AWS call that reports failure in its response body (e.g. DeleteVpcEndpoints' `Unsuccessful`)."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code


@functools.cache
def known_regions() -> frozenset[str]:
    """Regions botocore's endpoint data knows for EC2 in the commercial, China and GovCloud partitions
    (read once per process: loading botocore's endpoint data takes about half a second)."""
    import boto3

    session = boto3.session.Session()
    regions: set[str] = set()
    for partition in ("aws", "aws-cn", "aws-us-gov"):
        regions.update(session.get_available_regions("ec2", partition_name=partition))
    return frozenset(regions)


def validate_region(region: str | None) -> str:
    """Refuse an unknown region before any call is made (a typo would otherwise create nothing useful)."""
    if not region:
        raise ConfigurationError("no AWS region: set region_name on the operator or in the aws connection's extra")
    regions = known_regions()
    if region not in regions:
        near = sorted(r for r in regions if r.split("-")[0] == region.split("-")[0])[:6]
        raise ConfigurationError(f"unknown AWS region {region!r}; known regions like it: {', '.join(near) or 'none'}")
    return region


def wait_logged(
    waiter: Any,
    args: Mapping[str, Any],
    *,
    what: str,
    status_args: list[str],
    delay: int = 15,
    max_attempts: int = 40,
) -> None:
    """Block on a botocore waiter, logging the resource's status after every attempt (provider helper).

    `waiter` is `client.get_waiter(name)` or a hook's custom waiter (`hook.get_waiter(name)`)."""
    from airflow.providers.amazon.aws.utils.waiter_with_logging import wait

    wait(
        waiter=waiter,
        waiter_delay=delay,
        waiter_max_attempts=max_attempts,
        args=dict(args),
        failure_message=f"{what} did not reach the expected state",
        status_message=f"{what} status",
        status_args=status_args,
    )
