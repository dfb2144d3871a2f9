"""Account preflight: what a first real run trips on, asked by the first task before anything exists.

Each check asks one question of the account (or of this machine) and, when the answer is no, says
what to do: the key pair the cluster's nodes get exists (EC2 DescribeKeyPairs); every instance type
pcflow launches is offered in the availability zone the network will use (DescribeInstanceTypeOfferings
by zone: the network does not exist yet, but its zone is known now, chosen by the same function the
network stage uses, so this is the zone the instances will be asked for), and a capacity fallback's types
in the other zone it names; the account's vCPU quota of
each instance family covers the cluster at its maximum size (Service Quotas); the AMI builder's
instance profile exists, with a role (IAM GetInstanceProfile); the pcluster CLI and Node.js answer
(ParallelCluster only). All checks run, and every failure is reported at once.

A check that does not apply to the run (no ParallelCluster cluster, no image to bake) passes. The
profile may skip checks by name (`preflight.skip`) where the endpoint cannot answer them as AWS does.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from pcflow.aws.clients import error_code
from pcflow.errors import ConfigurationError
from pcflow.patterns import PREFLIGHT_CHECKS

if TYPE_CHECKING:
    from pcflow.resolved import PlannedRun

NODE_MIN_MAJOR = 14  # AWS CDK, which pcluster create/update-cluster run on (include/cluster/install-pcluster.sh)
#: vCPU quotas by instance family: (on-demand quota code, spot quota code, the quota's family name).
VCPU_QUOTAS = {
    "standard": ("L-1216C47A", "L-34B43A08", "Standard (A, C, D, H, I, M, R, T, Z)"),
    "g": ("L-DB2E81BA", "L-3819A6DF", "G and VT"),
    "p": ("L-417A185B", "L-7212CCBC", "P"),
    "f": ("L-74FC7D96", "L-88CF9481", "F"),
    "x": ("L-7295265B", "L-E3A00192", "X"),
    "inf": ("L-1945791B", "L-B5D1601B", "Inf"),
    "dl": ("L-6E869C2A", "L-85EED4F7", "DL"),
    "trn": ("L-2C3B7624", "L-6B0D517C", "Trn"),
    "hpc": ("L-F7808C92", None, "HPC"),
}


class PreflightFailed(ConfigurationError):
    """The account is not ready for this run; the message lists each problem and what to do."""


def quota_family(instance_type: str) -> str | None:
    """The vCPU quota family of an instance type (`g5.12xlarge` -> `g`), None when pcflow knows none."""
    prefix = re.match(r"^([a-z]+)", instance_type)
    letters = prefix.group(1) if prefix else ""
    if letters in ("inf", "trn", "dl", "hpc"):
        return letters
    if letters == "vt":
        return "g"
    if letters[:1] in tuple("acdhimrtz") and letters not in ("mac", "u"):
        return "standard"
    return letters if letters in ("g", "p", "f", "x") else None


@dataclass
class Account:
    """What the checks look at: the run's settings, the cluster it will create (None: no ParallelCluster
    cluster), AWS clients of the run's region."""

    run: PlannedRun
    cluster: Any
    client: Callable[[str], Any]
    pcluster_path: str | None = None

    @property
    def region(self) -> str:
        return self.run.region

    @cached_property
    def zone(self) -> str:
        """The zone the run's instances will be launched in (its network's)."""
        from pcflow.aws.network import choose_availability_zone

        network = self.run.network
        if network.public_subnet_id:  # an adopted VPC: the head node's subnet decides
            subnet = self.client("ec2").describe_subnets(SubnetIds=[network.public_subnet_id])["Subnets"][0]
            return subnet["AvailabilityZone"]
        return choose_availability_zone(self.client("ec2"), self.region, network.availability_zone)

    def launched_types(self) -> dict[str, str]:
        """What pcflow launches, by role (a static cluster's instance type only prices the run)."""
        types = {}
        if self.cluster is not None:
            types |= {"compute": self.cluster.instance_type, "head node": self.cluster.head_node_instance_type}
        if self.run.ami.enabled:
            types["AMI builder"] = self.run.ami.instance_type
        return types


def key_pair(account: Account) -> str | None:
    """The cluster's key pair must exist in the region, checked before anything is created; says how to import it."""
    if account.cluster is None:
        return None
    name = account.cluster.key_name
    try:
        account.client("ec2").describe_key_pairs(KeyNames=[name])
    except ClientError as exc:
        if error_code(exc) != "InvalidKeyPair.NotFound":
            raise
        return (
            f"the key pair {name!r} does not exist in {account.region}: import the public half of the key the "
            f"`{account.run.cluster.ssh_conn_id}` connection holds (aws ec2 import-key-pair --key-name {name} "
            f"--public-key-material fileb://key.pub --region {account.region}), or set cluster.config.key_name "
            "to a key pair that exists there"
        )
    return None


def _offered(ec2: Any, types: Sequence[str], zone: str | None = None) -> dict[str, set[str]]:
    """Zones offering each type (only `zone` when given)."""
    filters = [{"Name": "instance-type", "Values": sorted(set(types))}]
    if zone:
        filters.append({"Name": "location", "Values": [zone]})
    offered: dict[str, set[str]] = {t: set() for t in types}
    pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
        LocationType="availability-zone", Filters=filters
    )
    for page in pages:
        for offer in page["InstanceTypeOfferings"]:
            offered[offer["InstanceType"]].add(offer["Location"])
    return offered


def instance_types_offered(account: Account) -> str | None:
    """Every type pcflow launches must be offered where it is launched: the network's zone, and each capacity
    fallback's own zone where the option names one."""
    problems = [found for found in (own_zone_offered(account), fallback_zones_offered(account)) if found]
    return "; ".join(problems) or None


def fallback_zones_offered(account: Account) -> str | None:
    """A fallback option in another zone launches its types in that zone's subnet: each must be offered there
    (an option of types the zone lacks would never launch, and its move would only wait)."""
    options = [o for o in (account.cluster.fallback if account.cluster else ()) if o.availability_zone]
    missing = []
    for option in options:
        offered = _offered(account.client("ec2"), option.instance_types, option.availability_zone)
        missing += [f"{t} in {option.availability_zone}" for t in option.instance_types if not offered[t]]
    if not missing:
        return None
    return (
        f"capacity fallback {', '.join(missing)}: not offered in the zone the option names; pick types offered "
        "there or another zone (network.zone_subnet_cidrs)"
    )


def own_zone_offered(account: Account) -> str | None:
    """Every type pcflow launches must be offered in the zone the network will use; names a zone that offers
    them all, if one does."""
    types = account.launched_types()
    if not types:
        return None
    ec2, zone = account.client("ec2"), account.zone
    offered = _offered(ec2, list(types.values()), zone)
    missing = {role: t for role, t in types.items() if not offered[t]}
    if not missing:
        return None
    everywhere = _offered(ec2, list(types.values()))
    zones = sorted(set.intersection(*everywhere.values())) if everywhere else []
    where = (
        f"set network.availability_zone to one of {', '.join(zones)} (they offer all of them)"
        if zones
        else ("no zone of the region offers all of them: pick other types or another region")
    )
    listed = ", ".join(f"{role} {t}" for role, t in missing.items())
    return f"{listed}: not offered in {zone}, the zone the run's network uses; pick types offered there or {where}"


def _vcpus(ec2: Any, types: Sequence[str]) -> dict[str, int]:
    described = ec2.describe_instance_types(InstanceTypes=sorted(set(types)))["InstanceTypes"]
    return {t["InstanceType"]: int(t["VCpuInfo"]["DefaultVCpus"]) for t in described}


def _quota_value(quotas: Any, code: str) -> float:
    """The account's applied quota, else AWS's default (GetServiceQuota answers NoSuchResource for a
    quota never changed in some accounts and regions)."""
    try:
        return float(quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"])
    except ClientError as exc:
        if error_code(exc) != "NoSuchResourceException":
            raise
    return float(quotas.get_aws_default_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"])


def vcpu_needs(account: Account) -> dict[str, tuple[str, int]]:
    """vCPUs the cluster needs at its maximum size, by quota code: (what the quota covers, vCPUs)."""
    cluster = account.cluster
    vcpus = _vcpus(account.client("ec2"), [cluster.instance_type, cluster.head_node_instance_type])
    fleet = [
        (cluster.instance_type, cluster.capacity_type == "SPOT", cluster.max_count),
        (cluster.head_node_instance_type, False, 1),
    ]
    needs: dict[str, tuple[str, int]] = {}
    for instance_type, spot, count in fleet:
        family = quota_family(instance_type)
        if family is None or (spot and VCPU_QUOTAS[family][1] is None):
            continue  # no vCPU quota pcflow knows of for it: Service Quotas lists it per instance type
        on_demand, spot_code, name = VCPU_QUOTAS[family]
        code = spot_code if spot else on_demand
        label = f"All {name} Spot Instance Requests" if spot else f"Running On-Demand {name} instances"
        needs[code] = (label, needs.get(code, (label, 0))[1] + vcpus[instance_type] * count)
    return needs


def vcpu_quota(account: Account) -> str | None:
    """The account's vCPU quota of each instance family must cover the cluster at its maximum size, or compute
    nodes fail to launch and the job pends; says which quota to raise and by how much."""
    if account.cluster is None:
        return None
    quotas = account.client("service-quotas")
    problems = []
    for code, (label, need) in vcpu_needs(account).items():
        have = _quota_value(quotas, code)
        if have < need:
            problems.append(
                f"the cluster at its maximum size ({account.cluster.max_count} x {account.cluster.instance_type} "
                f"and the head node) needs {need} vCPUs of '{label}' ({code}) in {account.region}, the account's "
                f"quota is {have:g}: request an increase (aws service-quotas request-service-quota-increase "
                f"--service-code ec2 --quota-code {code} --desired-value {need} --region {account.region}) or "
                "lower cluster.config.max_count (a sweep's queue holds training.nodes x sweep.max_parallel: fewer "
                "trials at once need fewer)"
            )
    return "; ".join(problems) or None


def builder_instance_profile(account: Account) -> str | None:
    """The AMI builder's instance profile must exist and hold a role, or SSM never reaches the builder and the
    bake times out."""
    ami = account.run.ami
    if not ami.enabled:
        return None
    name = ami.instance_profile
    fix = (
        f"create it with a role that has AmazonSSMManagedInstanceCore (aws iam create-instance-profile "
        f"--instance-profile-name {name}; aws iam add-role-to-instance-profile --instance-profile-name {name} "
        "--role-name <role>), or set ami.instance_profile to one that exists"
    )
    try:
        profile = account.client("iam").get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
    except ClientError as exc:
        if error_code(exc) != "NoSuchEntity":
            raise
        return f"the AMI builder's instance profile {name!r} does not exist: {fix}"
    if not profile.get("Roles"):
        return f"the AMI builder's instance profile {name!r} has no role, so SSM cannot reach the builder: {fix}"
    return None


def pcluster_cli(account: Account) -> str | None:
    """The pcluster CLI must answer and find a recent enough Node.js (create-cluster runs AWS CDK), or the
    cluster stage fails after the network was made."""
    if account.cluster is None:
        return None
    from pcflow.cluster.pcluster import ParallelClusterHook, PclusterError

    hook = ParallelClusterHook(region_name=account.region, pcluster_path=account.pcluster_path, timeout=120)
    try:
        hook.version()
    except PclusterError as exc:
        return f"{exc} (run include/cluster/install-pcluster.sh, or point PCFLOW_PCLUSTER at a working CLI)"
    node = shutil.which("node", path=hook.subprocess_env().get("PATH"))
    install = f"install Node.js >= {NODE_MIN_MAJOR} on the workers' PATH (pcluster create-cluster runs AWS CDK on it)"
    if node is None:
        return f"Node.js is not on the PATH the pcluster CLI runs with: {install}"
    answer = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=60, check=False)
    major = re.match(r"^v(\d+)\.", answer.stdout.strip())
    if answer.returncode != 0 or major is None or int(major.group(1)) < NODE_MIN_MAJOR:
        return f"{node} answers {answer.stdout.strip() or answer.stderr.strip()[:200]!r}: {install}"
    return None


#: The checks by their names (`patterns.PREFLIGHT_CHECKS`, which a profile's `preflight.skip` names).
CHECKS: dict[str, Callable[[Account], str | None]] = dict(
    zip(
        PREFLIGHT_CHECKS,
        (key_pair, instance_types_offered, vcpu_quota, builder_instance_profile, pcluster_cli),
        strict=True,
    )
)


def run_preflight(account: Account, *, skip: Sequence[str] = ()) -> list[str]:
    """Every check not skipped; raises PreflightFailed listing each problem. Returns the checks run."""
    problems = []
    ran = [name for name in CHECKS if name not in skip]
    for name in ran:
        problem = CHECKS[name](account)
        if problem:
            problems.append(f"{name}: {problem}")
    if problems:
        raise PreflightFailed("account preflight failed, nothing was created:\n  " + "\n  ".join(problems))
    return ran
