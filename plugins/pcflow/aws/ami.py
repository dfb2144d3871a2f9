"""The AMI stage: bake a custom image once per recipe, reuse it on every later run.

Recipe hash = hash(base image, bootstrap script content, ParallelCluster version, extra inputs). An
available image tagged with the hash is reused at once. Otherwise a builder instance (IMDSv2 only, an
instance profile for SSM, a deterministic client token and tags) runs the bootstrap script through SSM
RunCommand; then it is stopped, imaged, and always terminated, also when a step failed. Every step
looks up by tag first, so a crash at any point is resumed by the retry, never duplicated.

A ParallelCluster AMI must start from a ParallelCluster image of the same version: unless a base image
is given, it is looked up by name (`aws-parallelcluster-<version>-<os>-hvm-<arch>*`) and owner.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow.sdk import conf

from pcflow.aws.base import PcflowAwsOperator, aws_template_fields
from pcflow.aws.clients import error_code, validate_region, wait_logged
from pcflow.aws.locks import LockNotHeld, S3Lock
from pcflow.aws.tags import refresh_expiry, tag_equals, tag_specifications
from pcflow.errors import PcflowError, ServiceFailed, WaitFailed, profile_setting, refused
from pcflow.events import SUCCESS, validate_event
from pcflow.naming import (
    TAG_STACK,
    Component,
    dag_run_of,
    digest,
    resource_name,
    run_key_from_context,
    standard_tags,
    validate_stack_name,
)
from pcflow.timeouts import STAGE_TIMEOUTS

log = logging.getLogger(__name__)

TAG_RECIPE = "pcflow:recipe-hash"
TAG_ROLE = "pcflow:role"
BUILDER_TTL = dt.timedelta(hours=6)
PCLUSTER_OSES = ("alinux2023", "ubuntu2204", "ubuntu2404", "rhel8", "rocky8", "rhel9", "rocky9")
#: A bake lock older than this was left by a task that died holding it: the image stage's execution
#: timeout, past which no holder is still baking.
BAKE_LOCK_STALE = STAGE_TIMEOUTS["image"]


class BootstrapFailed(ServiceFailed):
    """The bootstrap script failed on the builder; the message carries its output."""


def recipe_hash(
    base_image_id: str, bootstrap_script: str, pcluster_version: str, extra: Mapping[str, Any] | None = None
) -> str:
    """Identity of an image: any change to an input gives a new image, equal inputs reuse the old one."""
    return digest(base_image_id, bootstrap_script, pcluster_version, dict(extra or {}), length=16)


@dataclass(frozen=True)
class AmiSpec:
    """What the AMI stage bakes, checked on construction before any AWS call. The recipe (what names the image
    and decides reuse) is the base image, the script, the ParallelCluster version, `extra_inputs` and
    `script_env`; the builder's placement, `ttl` and `dag_run` are not part of it."""

    stack: str
    region: str
    pcluster_version: str
    bootstrap_script: str  # the script's content (see `load_script`)
    instance_profile: str  # name of an instance profile with AmazonSSMManagedInstanceCore
    subnet_id: str
    security_group_ids: tuple[str, ...] = ()
    instance_type: str = "c5.xlarge"
    base_image_id: str | None = None
    os: str = "alinux2023"
    architecture: str = "x86_64"
    base_image_owners: tuple[str, ...] = ("amazon",)
    extra_inputs: Mapping[str, Any] = field(default_factory=dict)
    #: Environment variables the bootstrap script reads (e.g. the payload's requirements); part of the recipe.
    script_env: Mapping[str, str] = field(default_factory=dict)
    #: Wait for the SSM agent to register before sending the command (moto lacks the API: tests turn it off).
    wait_for_ssm_agent: bool = True
    #: The image's `pcflow:expires`: it lives this long past the last run that used it (None: never).
    ttl: dt.timedelta | None = None
    #: The DAG run (dag_id, run_id) baking or reusing the image: the janitor keeps it while that run is
    #: unfinished. Like `ttl`, no part of the recipe.
    dag_run: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        validate_region(self.region)
        if self.os not in PCLUSTER_OSES:
            problem = f"{self.os!r} is not a ParallelCluster OS; use one of {', '.join(PCLUSTER_OSES)}"
            raise refused("ami.os", problem, profile_setting())
        if not self.bootstrap_script.strip():
            raise refused("ami.bootstrap_script", "the bootstrap script is empty", profile_setting())
        for name in self.script_env:
            if not re.fullmatch(r"[A-Z_][A-Z0-9_]{0,127}", name):
                problem = f"bootstrap environment variable {name!r} is not an upper-case shell name"
                raise refused("ami.environment", problem, profile_setting())
        object.__setattr__(self, "security_group_ids", tuple(self.security_group_ids))

    @property
    def recipe_inputs(self) -> dict[str, Any]:
        return {**self.extra_inputs, **({"script_env": dict(self.script_env)} if self.script_env else {})}

    def commands(self) -> list[str]:
        """The SSM RunCommand `commands`: one POSIX sh line that runs the script with bash, its environment
        set by `env`, every word quoted. aws:runShellScript joins the lines into a file that `sh` runs (dash
        on Ubuntu), so the script's own `#!/bin/bash` counts only on line 1 and nothing may come first."""
        assignments = [f"{name}={value}" for name, value in sorted(self.script_env.items())]
        return [shlex.join(["exec", "env", *assignments, "bash", "-c", self.bootstrap_script, "bootstrap.sh"])]


#: SSM command statuses after which the bootstrap is sent again (by a new try: a try that saw its own
#: command fail raises BootstrapFailed with the output).
COMMAND_FAILED = ("Failed", "Cancelled", "TimedOut", "Cancelling")


@dataclass(frozen=True)
class BakeWait:
    """What the bake waits for next: a botocore waiter (`name`) on `service`, with its arguments; the
    worker waits on it (`_Bake.wait`) or the operator defers it (`trigger`)."""

    service: str
    name: str
    args: dict[str, Any]
    what: str
    status_queries: tuple[str, ...]
    max_attempts: int = 40

    @classmethod
    def instance(cls, instance_id: str, name: str) -> BakeWait:
        """Wait for the builder instance with botocore's EC2 waiter `name` (running, stopped)."""
        status = ("Reservations[0].Instances[0].State.Name",)
        return cls("ec2", name, {"InstanceIds": [instance_id]}, f"builder {instance_id}", status)

    @classmethod
    def agent_online(cls, instance_id: str) -> BakeWait:
        """Wait for the builder's SSM agent to register: a command sent before that fails."""
        args = {"Filters": [{"Key": "InstanceIds", "Values": [instance_id]}]}
        return cls(
            "ssm", "AgentOnline", args, f"SSM agent of {instance_id}", ("InstanceInformationList[0].PingStatus",)
        )

    @classmethod
    def bootstrap(cls, command_id: str, instance_id: str) -> BakeWait:
        """Wait for the bootstrap command to end (a longer bound: the script installs the image's software)."""
        args = {"CommandId": command_id, "InstanceId": instance_id}
        return cls("ssm", "command_executed", args, f"bootstrap on {instance_id}", ("Status",), 240)

    @classmethod
    def image_available(cls, image_id: str) -> BakeWait:
        """Wait for the new image to become available (a longer bound: snapshotting takes minutes)."""
        return cls("ec2", "image_available", {"ImageIds": [image_id]}, f"image {image_id}", ("Images[0].State",), 240)

    def waiter(self, client: Any) -> Any:
        """botocore's waiter, or pcflow's own (`waiters/<service>.json`) for what botocore has none of."""
        from pcflow.aws.waits import custom_waiter

        return custom_waiter(client, self.service, self.name) or client.get_waiter(self.name)

    def trigger(self, *, waiter_delay: int, **connection: Any) -> Any:
        """The same wait in the triggerer."""
        from pcflow.aws import waits

        if self.name == "image_available":
            return waits.ImageAvailableTrigger(
                image_id=self.args["ImageIds"][0], waiter_delay=waiter_delay, **connection
            )
        return waits.BakeWaitTrigger(
            service=self.service,
            waiter=self.name,
            args=self.args,
            what=self.what,
            status_queries=list(self.status_queries),
            waiter_delay=waiter_delay,
            waiter_max_attempts=self.max_attempts,
            **connection,
        )


REQUIRES_PYTHON = re.compile(r"^#\s*requires-python:\s*>=\s*(3\.\d{1,2})(?![\d.])", re.MULTILINE)


def required_python(requirements: str, source: str | Path) -> str:
    """The oldest Python (`3.X`) the requirements install on, from their `# requires-python: >=3.X` line (a
    comment to pip). Pins alone do not say it, and the base images' python3 is older than many need (3.10 on
    Ubuntu 22.04, where numpy 2.3+ needs 3.11): the bootstrap gets a Python this new, so the bake asks here,
    before it launches a builder."""
    found = REQUIRES_PYTHON.findall(requirements)
    if len(found) != 1:
        problem = (
            f"the image's environment {source} must say once which Python its requirements need, with a line "
            f"like `# requires-python: >=3.11` (found {len(found)})"
        )
        raise refused("ami.environment", problem, profile_setting())
    return found[0]


def environment_script_env(requirements: str, source: str | Path) -> dict[str, str]:
    """What the bootstrap script reads to build the payload environment: its requirements, the oldest Python
    they install on, and include/ami/tree-record.sh, which writes the environment's integrity record (the
    one pcflow checks before a job runs in it: pcflow.slurm.environment). All part of the recipe."""
    return {
        "PCFLOW_PAYLOAD_REQUIREMENTS": requirements,
        "PCFLOW_PYTHON_MIN": required_python(requirements, source),
        "PCFLOW_TREE_RECORD": load_script("ami/tree-record.sh"),
    }


def load_script(path: str | Path) -> str:
    """A bootstrap script's content (only from `include/ami/`); its bytes are part of the recipe hash."""
    from pcflow.paths import ami_script

    script = ami_script(path)
    if not script.is_file():
        problem = f"bootstrap script {script} not found; AMI recipes live in include/ami/"
        raise refused("ami.bootstrap_script", problem, profile_setting())
    return script.read_text()


def find_base_image(
    ec2: Any,
    *,
    region: str,
    pcluster_version: str,
    os: str,
    architecture: str = "x86_64",
    owners: Sequence[str] = ("amazon",),
) -> str:
    """The newest ParallelCluster image of the version, OS and architecture: what a bake starts from."""
    pattern = f"aws-parallelcluster-{pcluster_version}-{os}-hvm-{architecture}*"
    images = ec2.describe_images(
        Owners=list(owners),
        Filters=[{"Name": "name", "Values": [pattern]}, {"Name": "state", "Values": ["available"]}],
    )["Images"]
    if not images:
        problem = (
            f"no ParallelCluster {pcluster_version} image named {pattern} owned by "
            f"{', '.join(owners)} in {region}; check the version, os and architecture, or give base_image_id"
        )
        raise refused("ami.pcluster_version", problem, profile_setting())
    return max(images, key=lambda i: i.get("CreationDate", ""))["ImageId"]


def check_base_image(ec2: Any, image_id: str, region: str) -> None:
    """Refuse a base image that does not exist or is not available in the region, before a builder is launched
    from it."""
    from botocore.exceptions import ClientError

    try:
        found = ec2.describe_images(ImageIds=[image_id])["Images"]
    except ClientError as error:
        if error_code(error).startswith("InvalidAMIID"):
            found = []
        else:
            raise
    if not found or found[0].get("State") != "available":
        problem = f"base image {image_id} does not exist (or is not available) in {region}"
        raise refused("ami.base_image_id", problem, profile_setting())


def check_instance_type(ec2: Any, instance_type: str, region: str) -> None:
    """Refuse a builder instance type the region does not offer, before anything is launched."""
    from botocore.exceptions import ClientError

    try:
        ec2.describe_instance_types(InstanceTypes=[instance_type])
    except ClientError as error:
        if error_code(error) == "InvalidInstanceType":
            problem = (
                f"instance type {instance_type!r} does not exist in {region}; pick one that "
                "`aws ec2 describe-instance-type-offerings` lists there"
            )
            raise refused("ami.instance_type", problem, profile_setting()) from None
        raise


def find_image(ec2: Any, stack: str, recipe: str) -> dict[str, Any] | None:
    """A pending or available image of this recipe (failed ones are ignored: a retry bakes again)."""
    images = ec2.describe_images(
        Owners=["self"],
        Filters=[
            tag_equals(TAG_STACK, stack),
            tag_equals(TAG_RECIPE, recipe),
            {"Name": "state", "Values": ["pending", "available"]},
        ],
    )["Images"]
    if len(images) > 1:
        available = [i for i in images if i["State"] == "available"]
        return available[0] if available else images[0]
    return images[0] if images else None


def bake_lock_key(stack: str, recipe: str) -> str:
    """The bake lock of one recipe of a stack, in the stack's data bucket."""
    return f"pcflow/images/{validate_stack_name(stack)}/{recipe}/lock"


@dataclass(frozen=True)
class BakeLocking:
    """Where a stack's bake locks are (its data bucket), who takes them (a run key: a retry of the same run
    takes its own over), and how a bake waiting in the worker waits for one (an operator defers instead).
    Two runs that start at once on a stack with no image bake it once: the one that gets the recipe's lock
    bakes, the other waits for the lock and then finds the image (looked up again before anything is made)."""

    s3: Any
    bucket: str
    holder: str
    timeout: float = BAKE_LOCK_STALE.total_seconds()
    delay: float = 15.0

    def lock(self, stack: str, recipe: str) -> S3Lock:
        """The recipe's lock: one per recipe, so runs baking different recipes do not wait for each other."""
        why = f"baking the image of recipe {recipe} of stack {stack}"
        key = bake_lock_key(stack, recipe)
        return S3Lock(self.s3, self.bucket, key, holder=self.holder, why=why, stale_after=BAKE_LOCK_STALE)


def release_quietly(lock: S3Lock | None) -> None:
    """Release a bake lock when the bake ended (done or failed); one taken over meanwhile (broken as stale
    by another run) is left to its new holder, and said, rather than failing a bake that is over."""
    if lock is None:
        return
    try:
        lock.release()
    except LockNotHeld as refused_release:
        log.warning("%s", refused_release)


class _Bake:
    """One bake of one recipe; every method can be re-entered after a crash."""

    def __init__(
        self, ec2: Any, ssm: Any, spec: AmiSpec, *, recipe: str, base_image: str, waiter_delay: int, attempt: str
    ):
        self.ec2, self.ssm, self.spec, self.recipe, self.base_image = ec2, ssm, spec, recipe, base_image
        self.waiter_delay, self.attempt = waiter_delay, attempt
        self.name = resource_name(spec.stack, Component.AMI, recipe)

    def tags(self, role: str, ttl: dt.timedelta | None = None) -> dict[str, str]:
        extra = {TAG_RECIPE: self.recipe, TAG_ROLE: role, "Name": self.name}
        ttl = ttl if role == "builder" else self.spec.ttl
        stack, dag_run = self.spec.stack, self.spec.dag_run
        return standard_tags(stack=stack, component=Component.AMI, ttl=ttl, extra=extra, dag_run=dag_run)

    def reuse(self, image: Mapping[str, Any]) -> dict[str, Any]:
        """An available image of the recipe, its expiry (and its snapshots') stamped again."""
        snapshots = [m["Ebs"]["SnapshotId"] for m in image.get("BlockDeviceMappings", []) if "Ebs" in m]
        refresh_expiry(self.ec2, [image["ImageId"], *snapshots], self.tags("image"))
        log.info("reusing image %s of recipe %s", image["ImageId"], self.recipe)
        return {"image_id": image["ImageId"], "recipe_hash": self.recipe, "reused": True}

    def find_builder(self) -> str | None:
        found = self.ec2.describe_instances(
            Filters=[
                tag_equals(TAG_STACK, self.spec.stack),
                tag_equals(TAG_RECIPE, self.recipe),
                tag_equals(TAG_ROLE, "builder"),
                {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]},
            ]
        )["Reservations"]
        ids = [i["InstanceId"] for r in found for i in r["Instances"]]
        return ids[0] if ids else None

    def launch_builder(self) -> str:
        existing = self.find_builder()
        if existing:
            log.info("adopting builder %s of recipe %s", existing, self.recipe)
            return existing
        kwargs: dict[str, Any] = {
            "ImageId": self.base_image,
            "InstanceType": self.spec.instance_type,
            "MinCount": 1,
            "MaxCount": 1,
            "SubnetId": self.spec.subnet_id,
            "IamInstanceProfile": {"Name": self.spec.instance_profile},
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
            "ClientToken": self.client_token,
            "TagSpecifications": tag_specifications(["instance", "volume"], self.tags("builder", BUILDER_TTL)),
        }
        if self.spec.security_group_ids:
            kwargs["SecurityGroupIds"] = list(self.spec.security_group_ids)
        instance_id = self.ec2.run_instances(**kwargs)["Instances"][0]["InstanceId"]
        log.info("launched builder %s (%s) from %s", instance_id, self.spec.instance_type, self.base_image)
        return instance_id

    @property
    def client_token(self) -> str:
        """RunInstances' idempotency token: the same for a repeat within one attempt (a request that timed
        out), new for the next attempt. EC2 keeps a token for at least 24 hours after its instance ended,
        so a token per recipe alone would hand a retry after a failed bootstrap its terminated builder."""
        return f"pcflow-{digest(self.spec.stack, 'ami-builder', self.recipe, self.attempt, length=40)}"

    def builder_state(self, instance_id: str) -> str:
        reservations = self.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        return reservations[0]["Instances"][0]["State"]["Name"]

    def agent_online(self, instance_id: str) -> bool:
        wanted = [{"Key": "InstanceIds", "Values": [instance_id]}]
        info = self.ssm.describe_instance_information(Filters=wanted).get("InstanceInformationList", [])
        return bool(info) and info[0].get("PingStatus") == "Online"

    def bootstrap_command(self, instance_id: str) -> dict[str, Any] | None:
        """The newest bootstrap command of this recipe on the builder, found by its comment after a crash."""
        commands = self.ssm.list_commands(InstanceId=instance_id)["Commands"]
        mine = [c for c in commands if c["Comment"] == self.comment]
        return max(mine, key=lambda c: str(c.get("RequestedDateTime", ""))) if mine else None

    @property
    def comment(self) -> str:
        return f"pcflow bootstrap {self.recipe}"

    def send_bootstrap(self, instance_id: str) -> str:
        command_id = self.ssm.send_command(
            InstanceIds=[instance_id],
            DocumentName="AWS-RunShellScript",
            Comment=self.comment,
            Parameters={"commands": self.spec.commands()},
            TimeoutSeconds=600,
        )["Command"]["CommandId"]
        log.info("bootstrap command %s sent to %s", command_id, instance_id)
        return command_id

    def check_bootstrap(self, command_id: str, instance_id: str) -> None:
        """Raise BootstrapFailed with the script's output unless the command succeeded."""
        out = self.ssm.get_command_invocation(CommandId=command_id, InstanceId=instance_id)
        if out.get("Status") == "Success":
            return
        raise BootstrapFailed(
            f"the bootstrap script failed on builder {instance_id} (status {out.get('Status')}, exit code "
            f"{out.get('ResponseCode')}).\n--- stdout ---\n{out.get('StandardOutputContent', '')}\n"
            f"--- stderr ---\n{out.get('StandardErrorContent', '')}"
        )

    def next_step(self) -> BakeWait | str:
        """The bake's next wait, from what AWS shows now (so a retry resumes where a crash left off), or
        the id of the available image. Acts only where nothing was done yet: launch, send, stop, image."""
        image = find_image(self.ec2, self.spec.stack, self.recipe)
        if image is not None:
            return image["ImageId"] if image["State"] == "available" else BakeWait.image_available(image["ImageId"])
        builder = self.launch_builder()
        state = self.builder_state(builder)
        command = self.bootstrap_command(builder)
        if command is None or command["Status"] in COMMAND_FAILED:
            if state == "pending":
                return BakeWait.instance(builder, "instance_running")
            if state != "running":
                raise PcflowError(f"builder {builder} is {state} before its bootstrap; a retry launches another")
            if self.spec.wait_for_ssm_agent and not self.agent_online(builder):
                return BakeWait.agent_online(builder)
            return BakeWait.bootstrap(self.send_bootstrap(builder), builder)
        if command["Status"] != "Success":
            return BakeWait.bootstrap(command["CommandId"], builder)
        return self.image_step(builder, state)

    def image_step(self, builder: str, state: str) -> BakeWait:
        """After a successful bootstrap: stop the builder, then image it."""
        if state in ("pending", "running"):
            self.ec2.stop_instances(InstanceIds=[builder])
            return BakeWait.instance(builder, "instance_stopped")
        if state == "stopping":
            return BakeWait.instance(builder, "instance_stopped")
        return BakeWait.image_available(self.create_image(builder))

    def create_image(self, instance_id: str) -> str:
        image_id = self.ec2.create_image(
            InstanceId=instance_id,
            Name=self.name,
            Description=f"pcflow {self.spec.stack} ParallelCluster {self.spec.pcluster_version} recipe {self.recipe}",
            TagSpecifications=tag_specifications(("image", "snapshot"), self.tags("image")),
        )["ImageId"]
        log.info("creating image %s from builder %s", image_id, instance_id)
        self.finish_image(image_id)
        return image_id

    def finish_image(self, image_id: str) -> None:
        """Require IMDSv2 (the image and its snapshots were tagged by CreateImage itself: the IAM policy
        lets pcflow tag only as it creates, and later move an expiry on)."""
        self.ec2.modify_image_attribute(ImageId=image_id, ImdsSupport={"Value": "v2.0"})

    def wait(self, step: BakeWait) -> None:
        """A step's wait in this process (the operator defers it instead)."""
        client = self.ssm if step.service == "ssm" else self.ec2
        try:
            wait_logged(
                step.waiter(client),
                step.args,
                what=step.what,
                status_args=list(step.status_queries),
                delay=self.waiter_delay,
                max_attempts=step.max_attempts,
            )
        except Exception:
            if step.name != "command_executed":
                raise
        if step.name == "command_executed":
            self.check_bootstrap(step.args["CommandId"], step.args["InstanceId"])

    def terminate_builder(self, instance_id: str | None) -> None:
        for candidate in {instance_id, self.find_builder()} - {None}:
            log.info("terminating builder %s", candidate)
            self.ec2.terminate_instances(InstanceIds=[candidate])


def prepare_bake(
    ec2: Any, ssm: Any, spec: AmiSpec, *, waiter_delay: int = 15, attempt: str = ""
) -> tuple[_Bake, dict[str, Any] | None]:
    """Validate inputs and look for an image of the recipe; nothing is created here. `attempt` names this
    try of the bake (a task's run and try number): a builder it launches is its own, one it finds is adopted."""
    check_instance_type(ec2, spec.instance_type, spec.region)
    base = spec.base_image_id or find_base_image(
        ec2,
        region=spec.region,
        pcluster_version=spec.pcluster_version,
        os=spec.os,
        architecture=spec.architecture,
        owners=spec.base_image_owners,
    )
    check_base_image(ec2, base, spec.region)
    recipe = recipe_hash(base, spec.bootstrap_script, spec.pcluster_version, spec.recipe_inputs)
    bake = _Bake(ec2, ssm, spec, recipe=recipe, base_image=base, waiter_delay=waiter_delay, attempt=attempt)
    return bake, find_image(ec2, spec.stack, recipe)


def attempt_of(context: Any) -> str:
    """This try of the task, as the builder's idempotency token tells tries apart."""
    ti = context["ti"]
    return f"{ti.run_id}/{ti.try_number}"


def bake_image(
    ec2: Any,
    ssm: Any,
    spec: AmiSpec,
    *,
    waiter_delay: int = 15,
    attempt: str = "",
    locking: BakeLocking | None = None,
) -> dict[str, Any]:
    """Ensure an available image of the recipe, waiting in this process; returns `{"image_id",
    "recipe_hash", "reused"}`. With `locking`, only under the recipe's bake lock, and the image is looked
    up again once the lock is held (a run that waited adopts what the holder baked). The builder is
    terminated at the end, also when a step failed."""
    bake, found = prepare_bake(ec2, ssm, spec, waiter_delay=waiter_delay, attempt=attempt)
    if found and found["State"] == "available":
        return bake.reuse(found)
    if locking is None:
        return _bake_here(bake, found)
    with locking.lock(spec.stack, bake.recipe).held(timeout=locking.timeout, delay=locking.delay):
        found = find_image(ec2, spec.stack, bake.recipe)
        if found and found["State"] == "available":
            return bake.reuse(found)
        return _bake_here(bake, found)


def _bake_here(bake: _Bake, found: dict[str, Any] | None) -> dict[str, Any]:
    """Every step and wait of the bake in this process (resumed from a pending image `found`, if any)."""
    try:
        step = bake.next_step()
        while isinstance(step, BakeWait):
            bake.wait(step)
            step = bake.next_step()
    finally:
        bake.terminate_builder(None)
    return {"image_id": step, "recipe_hash": bake.recipe, "reused": found is not None}


def delete_image(ec2: Any, image_id: str) -> list[str]:
    """Deregister an image and delete its snapshots; returns the snapshot ids deleted. Gone = done."""
    from botocore.exceptions import ClientError

    try:
        images = ec2.describe_images(ImageIds=[image_id])["Images"]
    except ClientError as error:
        if error_code(error).startswith("InvalidAMIID"):
            return []
        raise
    if not images:
        return []
    snapshots = [m["Ebs"]["SnapshotId"] for m in images[0].get("BlockDeviceMappings", []) if "Ebs" in m]
    ec2.deregister_image(ImageId=image_id)
    for snapshot_id in snapshots:
        ec2.delete_snapshot(SnapshotId=snapshot_id)
    return snapshots


# --- operator ----------------------------------------------------------------------------------


class BakeImageOperator(PcflowAwsOperator):
    """Ensure the stack's custom AMI; returns `{"image_id", "recipe_hash", "reused"}`.

    Each step (launch the builder, send the bootstrap, stop the builder, CreateImage) runs in the worker
    and each wait after it is deferred to the triggerer: the builder running, its SSM agent online, the
    bootstrap ended, the builder stopped, the image available. A resume reads the bake's state from AWS
    again, so a retry after a crash resumes and creates nothing twice. The builder is terminated on
    failure, on kill and at the end.

    :param environment_file: requirements of the training environment the image holds (the payload's
        `requirements.txt`): handed to the bootstrap script as PCFLOW_PAYLOAD_REQUIREMENTS, part of the
        recipe. The payload's code is not baked: each run ships it (`pcflow.slurm.payload`).
    :param ttl_hours: the image's `pcflow:expires`, stamped again by every run that reuses it, so an
        image no run uses any more is reaped by the janitor; None: never expires.
    :param lock_bucket: the stack's data bucket, where the recipe's bake lock is taken
        (`pcflow/images/<stack>/<recipe>/lock`, `BakeLocking`): of runs that find no image at once, one
        bakes and the others wait for its lock (deferred: `LockReleasedTrigger`) and then adopt its image.
        None: no lock (one run at a time bakes a recipe, or two runs may both bake it).
    """

    template_fields: Sequence[str] = aws_template_fields(
        *("stack", "pcluster_version", "subnet_id", "security_group_ids", "instance_type", "base_image_id"),
        *("extra_inputs", "bootstrap_script_path", "instance_profile", "os", "base_image_owners"),
        *("wait_for_ssm_agent", "enabled", "environment_file", "ttl_hours", "lock_bucket"),
    )

    def __init__(
        self,
        *,
        stack: str,
        pcluster_version: str,
        bootstrap_script_path: str,
        instance_profile: str,
        subnet_id: str,
        security_group_ids: Sequence[str] = (),
        instance_type: str = "c5.xlarge",
        base_image_id: str | None = None,
        base_image_owners: Sequence[str] = ("amazon",),
        os: str = "alinux2023",
        architecture: str = "x86_64",
        extra_inputs: Mapping[str, Any] | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        waiter_delay: int = 30,
        wait_for_ssm_agent: bool = True,
        enabled: bool = True,
        environment_file: str | None = None,
        ttl_hours: float | None = None,
        lock_bucket: str | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.enabled = enabled
        self.lock_bucket = lock_bucket
        self.environment_file = environment_file
        self.ttl_hours = ttl_hours
        self.stack, self.pcluster_version = stack, pcluster_version
        self.bootstrap_script_path, self.instance_profile = bootstrap_script_path, instance_profile
        self.subnet_id, self.security_group_ids = subnet_id, security_group_ids
        self.instance_type, self.base_image_id = instance_type, base_image_id
        self.base_image_owners = base_image_owners
        self.os, self.architecture, self.extra_inputs = os, architecture, extra_inputs
        self.deferrable, self.waiter_delay, self.wait_for_ssm_agent = deferrable, waiter_delay, wait_for_ssm_agent
        self._bake: _Bake | None = None
        self._lock: S3Lock | None = None

    def spec(self, context: Any) -> AmiSpec:
        """The AmiSpec from this task's rendered fields; the same every try, so each try computes the same recipe."""
        return AmiSpec(
            stack=self.stack,
            region=self.hook.region_name,
            pcluster_version=self.pcluster_version,
            bootstrap_script=load_script(self.bootstrap_script_path),
            instance_profile=self.instance_profile,
            subnet_id=self.subnet_id,
            security_group_ids=tuple(self.security_group_ids or ()),
            instance_type=self.instance_type,
            base_image_id=self.base_image_id or None,
            os=self.os,
            base_image_owners=tuple(self.base_image_owners or ("amazon",)),
            architecture=self.architecture,
            extra_inputs=dict(self.extra_inputs or {}),
            wait_for_ssm_agent=self.wait_for_ssm_agent,
            script_env=self.script_env(),
            ttl=dt.timedelta(hours=float(self.ttl_hours)) if self.ttl_hours is not None else None,
            dag_run=dag_run_of(context),
        )

    def script_env(self) -> dict[str, str]:
        """The payload environment's requirements, the oldest Python they install on and the record writer,
        for the bootstrap script (it installs the environment, not the code)."""
        if not self.environment_file:
            return {}
        path = Path(self.environment_file)
        if not path.is_file():
            problem = f"the image's environment {path} does not exist: set it to requirements"
            raise refused("ami.environment", problem, profile_setting())
        return environment_script_env(path.read_text(), path)

    def execute(self, context: Any) -> dict[str, Any]:
        if not self.enabled:
            self.log.info("No image wanted (a static cluster brings its own software); nothing baked")
            return {"image_id": None, "recipe_hash": None, "reused": False}
        spec, attempt = self.spec(context), attempt_of(context)
        if not self.deferrable:
            ssm, locking = self.client("ssm"), self.locking(context)
            return bake_image(self.ec2, ssm, spec, waiter_delay=self.waiter_delay, attempt=attempt, locking=locking)
        bake, found = self.prepare(context, spec)
        self._bake = bake
        if found and found["State"] == "available":
            bake.terminate_builder(None)  # left by an attempt that died after CreateImage, if any
            return bake.reuse(found)
        return self.bake_locked(context, bake)

    def locking(self, context: Any) -> BakeLocking | None:
        """The stack's bake locks for this run (None without `lock_bucket`)."""
        if not self.lock_bucket:
            return None
        return BakeLocking(self.client("s3"), self.lock_bucket, run_key_from_context(context), delay=self.waiter_delay)

    def bake_locked(self, context: Any, bake: _Bake) -> dict[str, Any]:
        """Take the recipe's bake lock, or defer until its holder is done (and then look again: `lock_released`);
        holding it, look for the image once more (the last holder may have finished it meanwhile) and bake."""
        locking = self.locking(context)
        if locking is not None:
            lock = locking.lock(self.stack, bake.recipe)
            found = lock.try_acquire()
            if found is not None:
                self.defer_on_lock(lock, found, method_name="lock_released", waiter_delay=self.waiter_delay)
            self._lock = lock
            image = find_image(self.ec2, self.stack, bake.recipe)
            if image and image["State"] == "available":
                self.finish(bake)
                return bake.reuse(image)
        return self.advance(bake)

    def lock_released(self, context: Any, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """Back from waiting for another run's bake of the recipe: its image is adopted when it exists, else
        this run takes the lock (or waits again) and bakes."""
        self.log.info("bake lock: %s", (event or {}).get("status"))
        return self.execute(context)

    def finish(self, bake: _Bake) -> None:
        """The bake is over (done or failed): terminate its builder, then release the recipe's lock."""
        try:
            bake.terminate_builder(None)
        finally:
            release_quietly(self._lock)
            self._lock = None

    def prepare(self, context: Any, spec: AmiSpec) -> tuple[_Bake, dict[str, Any] | None]:
        """The bake for this try, and the recipe's image if one exists; validates, creates nothing (see
        `prepare_bake`)."""
        return prepare_bake(
            self.ec2, self.client("ssm"), spec, waiter_delay=self.waiter_delay, attempt=attempt_of(context)
        )

    def advance(self, bake: _Bake) -> dict[str, Any]:
        """Take the bake's next step and defer its wait; once the image is available, terminate the builder
        and return the image. Each resume finds the state again in AWS, so nothing rides in the deferral."""
        try:
            step = bake.next_step()
        except Exception:
            self.finish(bake)
            raise
        if isinstance(step, str):
            self.finish(bake)
            return {"image_id": step, "recipe_hash": bake.recipe, "reused": False}
        self.log.info("AMI bake of recipe %s: waiting for %s (%s)", bake.recipe, step.what, step.name)
        self.defer(
            trigger=step.trigger(waiter_delay=self.waiter_delay, **self.trigger_aws_kwargs),
            method_name="execute_complete",
        )
        raise AssertionError("unreachable: defer raises")  # pragma: no cover

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """Back from one of the bake's waits: on to the next step, or fail with the reason (the builder
        terminated). The recipe is recomputed, not carried in the deferral's kwargs: `dag.test` drops those."""
        event = validate_event(event, task=self.task_id)
        bake, _ = self.prepare(context, self.spec(context))
        self._bake = bake
        locking = self.locking(context)
        self._lock = locking.lock(self.stack, bake.recipe) if locking else None  # this run's, held since it baked
        if event["status"] == SUCCESS:
            return self.advance(bake)
        waited = event.get("waited") or {}
        try:
            if waited.get("waiter") == "command_executed":
                bake.check_bootstrap(waited["CommandId"], waited["InstanceId"])  # BootstrapFailed, with its output
                return self.advance(bake)  # it ended well after the trigger gave up
            raise WaitFailed(f"AMI bake of recipe {bake.recipe}: {event.get('message') or event['status']}")
        except Exception:
            self.finish(bake)
            raise

    def on_kill(self) -> None:
        if self._bake is not None:
            self.finish(self._bake)
