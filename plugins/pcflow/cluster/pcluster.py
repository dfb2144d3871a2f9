"""`ParallelClusterHook`: the `pcluster` CLI (aws-parallelcluster 3.16.x) as a subprocess, JSON in and out.

The CLI lives in its own virtual environment (`include/cluster/install-pcluster.sh`): its pins (flask,
connexion, jsii, CDK v1, packaging) conflict with Airflow's. Node.js must be on that environment's PATH
for `create-cluster`/`update-cluster` (AWS CDK synthesises the CloudFormation template); `--dryrun true`,
`describe-cluster` and `delete-cluster` do not need it.

Where the CLI is: `pcluster_path` argument, else `PCFLOW_PCLUSTER` (the image sets it), else the
checkout's `.venv-pcluster/bin/pcluster` (an installed pcflow has no checkout beside it: then nothing).
The AWS connection (endpoint, CA bundle, region, credentials) is handed to the subprocess through the
standard AWS environment variables, which botocore inside pcluster honours.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from airflow.sdk import BaseHook

from pcflow.aws.calllog import CALLER_ENV
from pcflow.aws.clients import DEFAULT_AWS_CONN_ID
from pcflow.errors import ServiceFailed
from pcflow.paths import checkout_root

NOT_FOUND_MARKER = "does not exist"
#: How ParallelCluster starts the message of a configuration its schema or config loader refuses.
CONFIG_REJECTED = "Invalid cluster configuration"
#: How `create-cluster --dryrun true` reports a config that passed (exit code 1 all the same).
DRYRUN_PASSED = "Request would have succeeded, but DryRun flag is set."
#: What `update-compute-fleet --status` accepts for a Slurm cluster.
FLEET_REQUESTS = ("START_REQUESTED", "STOP_REQUESTED")


def default_pcluster_path() -> Path | None:
    """Where the pcluster CLI is unless the hook is told: `PCFLOW_PCLUSTER` (the image sets it), else the
    checkout's `.venv-pcluster`; None when neither is known."""
    configured = os.environ.get("PCFLOW_PCLUSTER")
    if configured:
        return Path(configured)
    root = checkout_root()
    return root / ".venv-pcluster" / "bin" / "pcluster" if root else None


class PclusterError(ServiceFailed):
    """The CLI failed; carries ParallelCluster's message, failure codes and validation messages."""

    def __init__(
        self,
        message: str,
        *,
        command: str = "",
        failures: Sequence[Mapping[str, str]] = (),
        validation_messages: Sequence[Mapping[str, str]] = (),
        update_errors: Sequence[Mapping[str, str]] = (),
        exit_code: int | None = None,
    ):
        self.pcluster_message = message
        self.command = command
        self.failures = [dict(f) for f in failures]
        self.validation_messages = [dict(v) for v in validation_messages]
        self.update_errors = [dict(u) for u in update_errors]
        self.exit_code = exit_code
        lines = [f"pcluster {command} failed: {message}".rstrip()]
        lines += [f"  {f.get('failureCode')}: {f.get('failureReason')}" for f in self.failures]
        lines += [
            f"  [{v.get('level')}] {v.get('type')}: {v.get('message')}"
            for v in self.validation_messages
            if v.get("level") in ("ERROR", "WARNING")
        ]
        lines += [
            f"  {u.get('parameter')}: {u.get('currentValue')} -> {u.get('requestedValue')}: {u.get('message')}"
            for u in self.update_errors
        ]
        super().__init__("\n".join(lines))

    @property
    def not_found(self) -> bool:
        return NOT_FOUND_MARKER in self.pcluster_message

    @property
    def config_rejected(self) -> bool:
        """ParallelCluster refused the configuration itself: a retry gives the same answer."""
        return bool(self.validation_messages) or self.pcluster_message.startswith(CONFIG_REJECTED)


class PclusterNotInstalled(PclusterError):
    """The pcluster CLI is not where pcflow looks; the message says how to install it or point `PCFLOW_PCLUSTER`
    at one."""

    pass


class ParallelClusterHook(BaseHook):
    """Run `pcluster` commands with the credentials and endpoint of an Airflow AWS connection."""

    conn_name_attr = "aws_conn_id"
    default_conn_name = DEFAULT_AWS_CONN_ID
    conn_type = "aws"
    hook_name = "AWS ParallelCluster CLI"

    def __init__(
        self,
        *,
        aws_conn_id: str | None = default_conn_name,
        region_name: str | None = None,
        verify: bool | str | None = None,
        botocore_config: Mapping[str, Any] | None = None,
        pcluster_path: str | os.PathLike | None = None,
        timeout: float = 900,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.aws_conn_id = aws_conn_id
        self._region_name = region_name
        self.verify = verify
        self.botocore_config = botocore_config
        self._pcluster_path = pcluster_path
        self.timeout = timeout

    @cached_property
    def pcluster_path(self) -> Path:
        path = Path(self._pcluster_path) if self._pcluster_path else default_pcluster_path()
        if path is None:
            raise PclusterNotInstalled(
                "PCFLOW_PCLUSTER is not set and pcflow is installed, not in a checkout with .venv-pcluster: "
                "point PCFLOW_PCLUSTER at the pcluster CLI (the image's is /opt/pcluster/bin/pcluster)",
                command="(not installed)",
            )
        if not os.access(path, os.X_OK):
            raise PclusterNotInstalled(
                f"no pcluster CLI at {path}: run include/cluster/install-pcluster.sh (it creates .venv-pcluster "
                "with aws-parallelcluster and checks Node.js), or point PCFLOW_PCLUSTER at an installed CLI",
                command="(not installed)",
            )
        return path

    @cached_property
    def aws_hook(self) -> Any:
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

        return AwsBaseHook(
            aws_conn_id=self.aws_conn_id,
            client_type="cloudformation",
            region_name=self._region_name,
            verify=self.verify,
            config=dict(self.botocore_config) if self.botocore_config else None,
        )

    @property
    def region_name(self) -> str | None:
        return self._region_name or self.aws_hook.region_name

    def subprocess_env(self) -> dict[str, str]:
        """The subprocess' environment: ours, plus the connection's region, endpoint, CA bundle, credentials
        (and who makes its AWS calls, for a call log: the CLI's user, not Airflow's role)."""
        env = dict(os.environ, **{CALLER_ENV: "pcluster"})
        hook = self.aws_hook
        if self.aws_conn_id:
            credentials = hook.get_credentials(region_name=self.region_name)
            env["AWS_ACCESS_KEY_ID"] = credentials.access_key
            env["AWS_SECRET_ACCESS_KEY"] = credentials.secret_key
            if credentials.token:
                env["AWS_SESSION_TOKEN"] = credentials.token
            else:
                env.pop("AWS_SESSION_TOKEN", None)
            endpoint = hook.conn_config.endpoint_url
            if endpoint:
                env["AWS_ENDPOINT_URL"] = endpoint
            verify = hook.verify if hook.verify is not None else hook.conn_config.verify
            if isinstance(verify, str):
                env["AWS_CA_BUNDLE"] = verify
        if self.region_name:
            env["AWS_DEFAULT_REGION"] = self.region_name
        return env

    # -- running the CLI ------------------------------------------------------------------------

    def run(self, command: str, *args: str, check: bool = True, regional: bool = True) -> dict[str, Any]:
        """`pcluster <command> <args> [--region R]`; the parsed JSON answer, or `PclusterError`."""
        argv = [str(self.pcluster_path), command, *args]
        if regional and self.region_name and "--region" not in args and "-r" not in args:
            argv += ["--region", self.region_name]
        self.log.info("pcluster %s %s", command, " ".join(a for a in args if not a.startswith("/")))
        try:
            proc = subprocess.run(
                argv, capture_output=True, text=True, env=self.subprocess_env(), timeout=self.timeout, check=False
            )
        except subprocess.TimeoutExpired as error:
            raise PclusterError(
                f"no answer within {self.timeout:.0f} s (an old Node.js can make CDK hang: check `node --version`)",
                command=command,
            ) from error
        answer = _parse_json(proc.stdout)
        if proc.returncode != 0 and check:
            message = answer.get("message") or (proc.stderr or proc.stdout).strip()[-2000:] or "no output"
            raise PclusterError(
                message,
                command=command,
                failures=answer.get("failures", ()),
                validation_messages=answer.get("configurationValidationErrors", answer.get("validationMessages", ())),
                update_errors=answer.get("updateValidationErrors", ()),
                exit_code=proc.returncode,
            )
        return answer

    def version(self) -> str:
        """The CLI's ParallelCluster version: the preflight's proof that the CLI runs at all."""
        return str(self.run("version", regional=False).get("version", ""))  # `version` takes no --region

    def describe_cluster(self, name: str) -> dict[str, Any] | None:
        """`describe-cluster`; None when the cluster does not exist."""
        try:
            return self.run("describe-cluster", "--cluster-name", name)
        except PclusterError as error:
            if error.not_found:
                return None
            raise

    def create_cluster(
        self,
        name: str,
        config_text: str,
        *,
        dryrun: bool = False,
        rollback_on_failure: bool = False,
        suppress_validators: Sequence[str] = (),
        validation_failure_level: str = "ERROR",
    ) -> dict[str, Any]:
        """`create-cluster`; with `dryrun` it only validates, and ParallelCluster's "would have succeeded" (exit
        code 1) is returned as an answer, not raised."""
        args = ["--cluster-name", name, "--dryrun", str(dryrun).lower()]
        if not dryrun:
            args += ["--rollback-on-failure", str(rollback_on_failure).lower()]
        args += ["--validation-failure-level", validation_failure_level]
        if suppress_validators:
            args += ["--suppress-validators", *(f"type:{v}" for v in suppress_validators)]
        try:
            return self._with_config_file("create-cluster", config_text, args)
        except PclusterError as error:
            if dryrun and error.pcluster_message.startswith(DRYRUN_PASSED):
                return {"message": error.pcluster_message, "validationMessages": error.validation_messages}
            raise

    def update_cluster(
        self, name: str, config_text: str, *, dryrun: bool = False, suppress_validators: Sequence[str] = ()
    ) -> dict[str, Any]:
        """`update-cluster`; with `dryrun`, ParallelCluster says whether (and how) the running cluster could
        take the new config."""
        args = ["--cluster-name", name, "--dryrun", str(dryrun).lower()]
        if suppress_validators:
            args += ["--suppress-validators", *(f"type:{v}" for v in suppress_validators)]
        return self._with_config_file("update-cluster", config_text, args)

    def delete_cluster(self, name: str) -> dict[str, Any] | None:
        """`delete-cluster`; None when there was nothing to delete."""
        try:
            return self.run("delete-cluster", "--cluster-name", name)
        except PclusterError as error:
            if error.not_found:
                return None
            raise

    def describe_compute_fleet(self, name: str) -> dict[str, Any]:
        """`describe-compute-fleet`: `{"status": "RUNNING"|"STOPPED"|..., "lastStatusUpdatedTime": ...}`."""
        return self.run("describe-compute-fleet", "--cluster-name", name)

    def update_compute_fleet(self, name: str, status: str) -> dict[str, Any]:
        """`update-compute-fleet --status START_REQUESTED|STOP_REQUESTED` (Slurm clusters); ParallelCluster's
        head node then starts or stops the compute nodes and sets the Slurm partitions UP or INACTIVE."""
        if status not in FLEET_REQUESTS:
            raise ValueError(f"compute fleet status must be one of {', '.join(FLEET_REQUESTS)}, not {status!r}")
        return self.run("update-compute-fleet", "--cluster-name", name, "--status", status)

    def _with_config_file(self, command: str, config_text: str, args: list[str]) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="pcflow-pcluster-") as tmp:
            path = Path(tmp) / "cluster-config.yaml"
            path.write_text(config_text)
            return self.run(command, "--cluster-configuration", str(path), *args)


def _parse_json(text: str) -> dict[str, Any]:
    """pcluster prints one JSON document on stdout (sometimes after log lines); {} when there is none."""
    text = text.strip()
    if not text:
        return {}
    start = text.find("{")
    try:
        value = json.loads(text[start:]) if start >= 0 else {}
    except json.JSONDecodeError:
        return {"message": text[-2000:]}
    return value if isinstance(value, dict) else {"value": value}
