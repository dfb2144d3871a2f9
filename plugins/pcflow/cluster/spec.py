"""What a ParallelCluster cluster is made from: one validated model, refused before anything is created.

The checks that need no AWS call happen on construction (names, counts, FSx sizes); the instance-type
check (`check_instance_type`) asks EC2 `DescribeInstanceTypes`, so a GPU queue of a CPU-only type is
refused by the validate task, before the network, AMI or dataset stages spend anything.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pcflow.aws.clients import error_code, validate_region
from pcflow.aws.ssh_ingress import refuse_anywhere
from pcflow.capacity import AllocationStrategy, CapacityOption
from pcflow.cluster.node_setup import DEFAULT_JOB_UID
from pcflow.errors import ConfigurationError
from pcflow.fsx import HEAD_NODE_INSTANCE_TYPE, FsxSpec
from pcflow.naming import AWS_TAG_VALUE_RE, TAG_PREFIX
from pcflow.patterns import JOB_USER, MAX_JOB_ACCOUNTS

#: ParallelCluster's own rule (`pcluster create-cluster` answers "does not match '^[a-zA-Z][a-zA-Z0-9-]+$'").
CLUSTER_NAME_RE = re.compile(r"^[a-zA-Z][a-zA-Z0-9-]+$")
CLUSTER_NAME_MAX = 60
#: With Slurm accounting the limit is lower (the name becomes part of the accounting database's cluster name).
CLUSTER_NAME_MAX_ACCOUNTING = 40
OS_CHOICES = ("alinux2023", "ubuntu2204", "ubuntu2404", "rhel8", "rocky8", "rhel9", "rocky9")
NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,24}$")  # queue / compute resource / storage names
#: Tag keys a cluster config may not set: pcflow's own (ownership, expiry), AWS's and ParallelCluster's.
RESERVED_TAG_PREFIXES = (TAG_PREFIX, "aws:", "parallelcluster:")


class ClusterSpecError(ConfigurationError):
    """The cluster spec is invalid; the message names the field and what to change."""


def validate_cluster_name(name: str, *, slurm_accounting: bool = False) -> str:
    """The name when ParallelCluster would accept it (its pattern, and 60 characters, 40 with Slurm accounting);
    refused here, naming the rule, before any call."""
    limit = CLUSTER_NAME_MAX_ACCOUNTING if slurm_accounting else CLUSTER_NAME_MAX
    if not isinstance(name, str) or not CLUSTER_NAME_RE.fullmatch(name):
        raise ClusterSpecError(
            f"invalid cluster name {name!r}: ParallelCluster names start with a letter and contain only "
            "letters, digits and hyphens (for example 'pcflow-research-cluster')"
        )
    if len(name) > limit:
        why = " with Slurm accounting" if slurm_accounting else ""
        raise ClusterSpecError(
            f"cluster name {name!r} has {len(name)} characters; ParallelCluster allows at most {limit}{why}: "
            "choose a shorter stack or cluster name"
        )
    return name


def _refuse_reserved_tag(key: str, where: str) -> None:
    if key.lower().startswith(RESERVED_TAG_PREFIXES):
        raise ValueError(
            f"{where}: tag key {key!r} is reserved ({', '.join(RESERVED_TAG_PREFIXES)}): pcflow sets its own tags "
            "(which stack and run own the cluster, when it expires); choose another key"
        )


def _tag_keys(node: Any, where: str) -> list[tuple[str, str]]:
    """Every `Tags: [{Key: ...}]` key anywhere in a ParallelCluster config fragment (cluster, queue...)."""
    found: list[tuple[str, str]] = []
    if isinstance(node, dict):
        for name, child in node.items():
            if name == "Tags" and isinstance(child, list):
                found += [(f"{where}.Tags", str(t.get("Key", ""))) for t in child if isinstance(t, dict)]
            else:
                found += _tag_keys(child, f"{where}.{name}")
    elif isinstance(node, list):
        for index, child in enumerate(node):
            found += _tag_keys(child, f"{where}[{index}]")
    return found


class ClusterSpec(BaseModel):
    """The inputs of `pcflow/cluster/templates/gpu-training.yaml.j2`; unknown keys are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    region: str
    os: Literal[OS_CHOICES] = "ubuntu2204"  # type: ignore[valid-type]
    custom_ami: str | None = Field(None, pattern=r"^ami-[0-9a-f]{8,17}$")
    key_name: str = Field(min_length=1, max_length=255)
    head_node_instance_type: str = HEAD_NODE_INSTANCE_TYPE
    head_node_root_volume_gib: int = Field(100, ge=40, le=16384)
    head_subnet_id: str = Field(pattern=r"^subnet-[0-9a-f]{8,17}$")
    compute_subnet_ids: tuple[str, ...] = ()
    #: The network's compute subnet in each other zone (zone -> id): a fallback that names a zone launches there.
    zone_subnet_ids: dict[str, str] = Field(default_factory=dict)
    head_security_group_ids: tuple[str, ...] = ()
    compute_security_group_ids: tuple[str, ...] = ()
    #: ParallelCluster's `HeadNode.Ssh.AllowedIps` (one IPv4 CIDR or a prefix list id): always rendered,
    #: since ParallelCluster opens SSH to 0.0.0.0/0 without it (the pipeline fills it from the network).
    ssh_allowed_ips: str | None = None
    allow_ssh_from_anywhere: bool = False
    queue_name: str = "gpu"
    compute_resource_name: str = "gpu"
    instance_type: str = "g5.xlarge"
    capacity_type: Literal["ONDEMAND", "SPOT"] = "ONDEMAND"
    min_count: int = Field(0, ge=0)
    max_count: int = Field(1, ge=1, le=1000)
    job_nodes: int = Field(1, ge=1)
    gpus_required: bool = True
    #: More instance types of the first queue's compute resource (ParallelCluster's flexible instance types),
    #: its allocation strategy and capacity reservation; the fallback queues, tried in order (pcflow.capacity).
    instance_types: tuple[str, ...] = ()
    allocation_strategy: AllocationStrategy | None = None
    capacity_reservation_id: str | None = Field(None, pattern=r"^cr-[0-9a-f]{8,17}$")
    fallback: tuple[CapacityOption, ...] = ()
    placement_group: bool | None = None  # None: on for a queue with EFA
    efa: bool | None = None  # None: enabled when every instance type of the queue supports it
    #: ParallelCluster's GPU health check before each job (HealthChecks.Gpu); None: on for a GPU queue.
    gpu_health_checks: bool | None = None
    scaledown_idletime_minutes: int = Field(10, ge=1)
    slurm_accounting: bool = False
    s3_bucket: str | None = None
    s3_prefix: str = ""
    fsx: FsxSpec | None = None
    tags: dict[str, str] = Field(default_factory=dict)
    #: Settings the template does not cover, deep-merged into the rendered config (ParallelCluster's
    #: schema validates them in the dry run).
    extra_config: dict[str, Any] = Field(default_factory=dict)
    allow_updates: bool = False
    #: The admin's IAM policy every role ParallelCluster creates for this cluster is bounded by (the
    #: pcluster CLI policy in include/iam/ allows role creation only with it).
    permissions_boundary: str | None = Field(None, pattern=r"^arn:aws[a-z-]*:iam::\d{12}:policy/[\w+=,.@/-]+$")
    shared_root: str | None = None  # where jobs keep their files; default: the FSx mount, else /home
    #: The account jobs run as (the profile's `cluster.job_user`, which the pipeline passes): every node
    #: makes it and refuses it the instance metadata service (node_setup.py). None: no node setup.
    job_user: str | None = None
    #: Its uid and gid on every node (the shared file systems see numbers): the admin's, in cluster.config.
    job_uid: int = Field(DEFAULT_JOB_UID, ge=1000, le=60000)
    #: How many accounts the nodes make (the profile's `cluster.job_accounts`): `job_user`, `<job_user>-1`, ...
    #: with uids `job_uid`, `job_uid + 1`, ...; each running run leases one (pcflow.slurm.accounts).
    job_accounts: int = Field(1, ge=1, le=MAX_JOB_ACCOUNTS)
    #: The admin's managed policy that lets a node set its own IMDS hop limit to 1 and nothing else
    #: (include/iam/pcflow-cluster-node-policy.json), attached to the head and compute roles.
    node_policy: str | None = Field(None, pattern=r"^arn:aws[a-z-]*:iam::\d{12}:policy/[\w+=,.@/-]+$")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return validate_cluster_name(value)

    @field_validator("region")
    @classmethod
    def _region(cls, value: str) -> str:
        return validate_region(value)

    @field_validator("queue_name", "compute_resource_name")
    @classmethod
    def _short_name(cls, value: str) -> str:
        if not NAME_RE.fullmatch(value):
            raise ValueError(f"{value!r}: use up to 25 lower-case letters, digits and hyphens, starting with a letter")
        return value

    @field_validator("compute_subnet_ids", "head_security_group_ids", "compute_security_group_ids", mode="before")
    @classmethod
    def _list(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError(f"must be a list, not the string {value!r}")
        return value

    @field_validator("ssh_allowed_ips")
    @classmethod
    def _allowed_ips(cls, value: str | None) -> str | None:
        if value is None or re.fullmatch(r"pl-[0-9a-f]{8,17}", value):
            return value
        try:
            network = ipaddress.ip_network(value, strict=True)
        except ValueError:
            network = None
        if network is None or network.version != 4:
            raise ValueError(f"{value!r} is neither an IPv4 CIDR nor a prefix list id (pl-...), all AllowedIps takes")
        return value

    @field_validator("job_user")
    @classmethod
    def _job_user(cls, value: str | None) -> str | None:
        if value is not None and not JOB_USER.fullmatch(value):
            raise ValueError(f"{value!r} is not a user name (lower-case letters, digits, _ and -, at most 32)")
        return value

    @field_validator("s3_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        return value.strip("/")

    @field_validator("tags")
    @classmethod
    def _tags(cls, value: dict[str, str]) -> dict[str, str]:
        for key, tag_value in value.items():
            if not key or len(key) > 128 or not AWS_TAG_VALUE_RE.fullmatch(tag_value):
                raise ValueError(f"tag {key}={tag_value!r} is not a valid AWS tag")
            _refuse_reserved_tag(key, "tags")
        return value

    @field_validator("extra_config")
    @classmethod
    def _extra_config_tags(cls, value: dict[str, Any]) -> dict[str, Any]:
        for where, key in _tag_keys(value, "extra_config"):
            _refuse_reserved_tag(key, where)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ClusterSpec:
        validate_cluster_name(self.name, slurm_accounting=self.slurm_accounting)
        if self.max_count < self.job_nodes:
            raise ValueError(
                f"max_count {self.max_count} is below the job's {self.job_nodes} node(s): the job could never "
                f"start; raise max_count to at least {self.job_nodes}"
            )
        if self.min_count > self.max_count:
            raise ValueError(f"min_count {self.min_count} is above max_count {self.max_count}")
        if self.fsx is not None and not self.s3_bucket:
            raise ValueError("fsx needs s3_bucket (and s3_prefix): the file system is linked to the dataset in S3")
        for sid in self.compute_subnet_ids:
            if not re.fullmatch(r"subnet-[0-9a-f]{8,17}", sid):
                raise ValueError(f"compute_subnet_ids: {sid!r} is not a subnet id")
        return self

    @model_validator(mode="after")
    def _zones(self) -> ClusterSpec:
        """A fallback's zone needs the network's subnet there; and ParallelCluster refuses compute subnets in
        more than one place beside a file system it creates (ManagedFsxMultiAzValidator), so no zone with `fsx`."""
        for sid in self.zone_subnet_ids.values():
            if not re.fullmatch(r"subnet-[0-9a-f]{8,17}", sid):
                raise ValueError(f"zone_subnet_ids: {sid!r} is not a subnet id")
        zones = [o.availability_zone for o in self.fallback if o.availability_zone]
        missing = sorted(set(zones) - set(self.zone_subnet_ids))
        if missing:
            raise ValueError(
                f"fallback: availability zone(s) {missing} have no subnet of the network (network.zone_subnet_cidrs)"
            )
        if zones and self.fsx is not None:
            raise ValueError(
                f"fallback: a queue in another availability zone ({', '.join(zones)}) beside fsx: ParallelCluster "
                "refuses a file system it creates when the queues' subnets are more than one "
                "(ManagedFsxMultiAzValidator); drop the zone from the fallback or the fsx section"
            )
        return self

    @model_validator(mode="after")
    def _node_setup(self) -> ClusterSpec:
        """A job account needs what its node setup needs: a bucket the script is kept in (and the nodes
        read it from), and the policy that lets each node lower its own IMDS hop limit."""
        if self.job_user is None:
            return self
        if self.job_uid + self.job_accounts - 1 > 60000:
            raise ValueError(f"job_uid {self.job_uid} + job_accounts {self.job_accounts} reaches past uid 60000")
        if not self.s3_bucket:
            raise ValueError(f"job_user {self.job_user!r} needs s3_bucket: the nodes read their setup script there")
        if not self.node_policy:
            raise ValueError(
                f"job_user {self.job_user!r} needs node_policy (cluster.config): the ARN of the admin's "
                "pcflow-cluster-node policy (include/iam/pcflow-cluster-node-policy.json), without which no "
                "node can set its IMDS hop limit and every node's setup fails"
            )
        return self

    @model_validator(mode="after")
    def _ssh_source(self) -> ClusterSpec:
        """Never ParallelCluster's default AllowedIps (0.0.0.0/0); the internet only when asked for."""
        if self.ssh_allowed_ips is None:
            raise ValueError(
                "ssh_allowed_ips is not set: ParallelCluster would open the head node's SSH port to 0.0.0.0/0; "
                "give the CIDR the Airflow workers connect from (the pipeline takes it from network.ssh_ingress_cidrs)"
            )
        if not self.ssh_allowed_ips.startswith("pl-"):
            refuse_anywhere([self.ssh_allowed_ips], self.allow_ssh_from_anywhere, "ssh_allowed_ips")
        return self

    @property
    def all_instance_types(self) -> tuple[str, ...]:
        """Every type a queue of this cluster may launch: what DescribeInstanceTypes is asked about."""
        types = [self.instance_type, *self.instance_types, *(t for o in self.fallback for t in o.instance_types)]
        return tuple(dict.fromkeys(types))

    @property
    def compute_subnets(self) -> tuple[str, ...]:
        return self.compute_subnet_ids or (self.head_subnet_id,)

    def subnets_for(self, option: CapacityOption | None) -> tuple[str, ...]:
        """A queue's subnets: its option's zone's subnet where it names one, else compute's own."""
        zone = option.availability_zone if option is not None else None
        return (self.zone_subnet_ids[zone],) if zone else self.compute_subnets

    @property
    def mounts(self) -> list[str]:
        return [self.fsx.mount_dir] if self.fsx else []

    @property
    def effective_shared_root(self) -> str:
        return self.shared_root or (self.fsx.mount_dir if self.fsx else "/home")

    @classmethod
    def parse(cls, values: Any) -> ClusterSpec:
        """From a DAG param / spec section; pydantic's errors become one readable `ClusterSpecError`."""
        if isinstance(values, ClusterSpec):
            return values
        try:
            return cls.model_validate(values)
        except ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'spec'}: {e['msg'].removeprefix('Value error, ')}"
                for e in error.errors()
            )
            raise ClusterSpecError(f"invalid cluster spec: {problems}") from None


def check_instance_type(ec2: Any, instance_type: str, *, gpus_required: bool, efa: bool | None) -> dict[str, Any]:
    """What EC2 says about the instance type: GPU count and EFA support; refuses a CPU type for a GPU queue."""
    try:
        found = ec2.describe_instance_types(InstanceTypes=[instance_type])["InstanceTypes"]
    except Exception as error:
        if error_code(error) == "InvalidInstanceType":
            raise ClusterSpecError(
                f"instance type {instance_type!r} does not exist in this region (EC2 DescribeInstanceTypes): "
                "check the spelling and the region"
            ) from None
        raise
    if not found:
        raise ClusterSpecError(f"instance type {instance_type!r} is not offered in this region")
    info = found[0]
    gpus = sum(g.get("Count", 0) for g in (info.get("GpuInfo") or {}).get("Gpus", []))
    efa_supported = bool((info.get("NetworkInfo") or {}).get("EfaSupported"))
    if gpus_required and gpus == 0:
        raise ClusterSpecError(
            f"instance type {instance_type!r} has no GPUs, but the queue is a GPU queue: choose a GPU type "
            "(g5, g6, p4d, p5, ...) or set gpus_required=false"
        )
    if efa and not efa_supported:
        raise ClusterSpecError(f"instance type {instance_type!r} does not support EFA: set efa=false or pick another")
    return {"instance_type": instance_type, "gpus": gpus, "efa_supported": efa_supported}
