"""The local stack as tests see it: start/stop/status through stack.py, its env file, its endpoints."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

REPO = Path(__file__).resolve().parents[1]
STACK_SCRIPT = REPO / "include" / "local" / "stack.py"
T = TypeVar("T")


def settled(read: Callable[[], T], *, quiet_s: float, timeout_s: float, every_s: float) -> T:
    """What `read` returns once its answer has not changed for `quiet_s` (or at `timeout_s`): what a
    service shows just after a client was killed or a job ended can still change for a moment."""
    deadline = time.monotonic() + timeout_s
    answer, stable_since = read(), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - stable_since < quiet_s:
        time.sleep(every_s)
        again = read()
        if again != answer:
            answer, stable_since = again, time.monotonic()
    return answer


def stack_cli(*args: str, state_dir: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if state_dir is not None:
        env["PCFLOW_STACK_DIR"] = str(state_dir)
    return subprocess.run(
        [sys.executable, str(STACK_SCRIPT), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )


def stack_status(state_dir: Path | None = None) -> dict[str, dict]:
    proc = stack_cli("status", "--json", state_dir=state_dir)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def read_env_file(path: Path) -> dict[str, str]:
    """KEY='value' lines as stack.py writes them (shell-quoted)."""
    env = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = shlex.split(value)[0] if value else ""
    return env


def start_for_script() -> Path:
    """For scripts outside pytest (benchmarks): start the local stack (a no-op when it is up), take its
    environment into os.environ, and return the shared root every Slurm node sees."""
    up = stack_cli("up")
    if up.returncode != 0:
        raise SystemExit(f"the local stack did not start:\n{up.stdout}{up.stderr}")
    env = read_env_file(Path(os.environ.get("PCFLOW_STACK_DIR", REPO / ".stack")) / "env")
    os.environ.update(env)
    return Path(json.loads(env["AIRFLOW_CONN_SLURM_DEFAULT"])["extra"]["shared_root"])


@dataclass(frozen=True)
class LocalStack:
    state_dir: Path
    env: dict[str, str]
    ports: dict[str, int]

    @property
    def slurm_connection(self) -> dict:
        return json.loads(self.env["AIRFLOW_CONN_SLURM_DEFAULT"])

    @property
    def shared_root(self) -> Path:
        return Path(self.slurm_connection["extra"]["shared_root"])


# --- the moto server between test modules -----------------------------------------------------

_LIVE_INSTANCE = ["pending", "running", "stopping", "stopped", "shutting-down"]


def _boto(stack: LocalStack, service: str, region: str = "us-east-1"):
    import boto3

    return boto3.client(
        service,
        endpoint_url=f"https://127.0.0.1:{stack.ports['moto']}",
        verify=str(stack.state_dir / "tls" / "ca.pem"),
        region_name=region,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def tell_standin(stack: LocalStack, route: str, body: dict) -> None:
    """POST to one of the moto stand-ins' routes (include/local/moto_standins.py), e.g. "fsx/task-outcomes"."""
    import ssl
    import urllib.request

    context = ssl.create_default_context(cafile=str(stack.state_dir / "tls" / "ca.pem"))
    url = f"https://127.0.0.1:{stack.ports['moto']}/moto-api/static/{route}"
    headers = {"Content-Type": "application/json"}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers=headers)
    with urllib.request.urlopen(request, context=context, timeout=60) as answer:
        answer.read()


def moto_leftovers(stack: LocalStack) -> list[str]:
    """What is on the moto server beyond what the stack seeds: live instances, anything pcflow-tagged
    that still exists (terminated instances and deleted NAT gateways are final states, not leaks),
    buckets, images and instance profiles. Meant for a freshly reset server, where all of it is a leak."""
    import stack as stack_script  # include/local/stack.py: what it seeds

    ec2, s3, iam = _boto(stack, "ec2"), _boto(stack, "s3"), _boto(stack, "iam")
    account = _boto(stack, "sts").get_caller_identity()["Account"]
    pcflow = [{"Name": "tag-key", "Values": ["pcflow:stack"]}]
    found = [
        f"instance {i['InstanceId']} ({i['State']['Name']})"
        for r in ec2.describe_instances(Filters=[{"Name": "instance-state-name", "Values": _LIVE_INSTANCE}])[
            "Reservations"
        ]
        for i in r["Instances"]
    ]
    listings = {
        "vpc": ("describe_vpcs", "Vpcs", "VpcId", {}),
        "subnet": ("describe_subnets", "Subnets", "SubnetId", {}),
        "security-group": ("describe_security_groups", "SecurityGroups", "GroupId", {}),
        "internet-gateway": ("describe_internet_gateways", "InternetGateways", "InternetGatewayId", {}),
        "route-table": ("describe_route_tables", "RouteTables", "RouteTableId", {}),
        "network-interface": ("describe_network_interfaces", "NetworkInterfaces", "NetworkInterfaceId", {}),
        "elastic-ip": ("describe_addresses", "Addresses", "AllocationId", {}),
        "volume": ("describe_volumes", "Volumes", "VolumeId", {}),
    }
    for kind, (call, key, id_key, extra) in listings.items():
        found += [f"{kind} {r[id_key]}" for r in getattr(ec2, call)(Filters=pcflow, **extra)[key]]
    found += [
        f"nat-gateway {n['NatGatewayId']}"
        for n in ec2.describe_nat_gateways(Filter=pcflow)["NatGateways"]
        if n["State"] not in ("deleted", "deleting")
    ]
    found += [
        f"vpc-endpoint {e['VpcEndpointId']}"
        for e in ec2.describe_vpc_endpoints(Filters=pcflow)["VpcEndpoints"]
        if e["State"].lower() not in ("deleted", "deleting")
    ]
    seeded_image = f"aws-parallelcluster-{stack_script.PCLUSTER_VERSION}-alinux2023-hvm-x86_64-local-standin"
    found += [
        f"image {i['ImageId']} ({i['Name']})"
        for i in ec2.describe_images(Owners=["self"])["Images"]
        if i["Name"] != seeded_image
    ]
    seeded_snapshots = {
        m["Ebs"]["SnapshotId"]
        for i in ec2.describe_images(Owners=["self"])["Images"]
        for m in i.get("BlockDeviceMappings", [])
        if "Ebs" in m
    }
    own = [{"Name": "owner-id", "Values": [account]}]  # moto ignores OwnerIds; its catalogue is not ours
    found += [
        f"snapshot {s['SnapshotId']}"
        for s in ec2.describe_snapshots(Filters=own)["Snapshots"]
        if s["SnapshotId"] not in seeded_snapshots
    ]
    found += [
        f"key-pair {k['KeyName']}"
        for k in ec2.describe_key_pairs()["KeyPairs"]
        if k["KeyName"] != stack_script.KEY_PAIR
    ]
    found += [f"bucket {b['Name']}" for b in s3.list_buckets().get("Buckets", [])]
    found += [
        f"instance-profile {p['InstanceProfileName']}"
        for p in iam.list_instance_profiles()["InstanceProfiles"]
        if p["InstanceProfileName"] != stack_script.BUILDER_PROFILE
    ]
    return found


def reset_moto(stack: LocalStack) -> None:
    """Empty the moto server (`POST /moto-api/reset`) and re-seed it as `stack.py up` does."""
    import ssl
    import urllib.request

    import stack as stack_script  # include/local/stack.py

    context = ssl.create_default_context(cafile=str(stack.state_dir / "tls" / "ca.pem"))
    request = urllib.request.Request(f"https://127.0.0.1:{stack.ports['moto']}/moto-api/reset", method="POST")
    with urllib.request.urlopen(request, context=context, timeout=60) as answer:
        answer.read()
    layout = stack_script.Layout(root=stack.state_dir, ports=stack.ports, user="", host="")
    stack_script.seed_emulated_account(layout)
