"""Who may reach the head node's SSH port: the profile's `network.ssh_ingress_cidrs`, the admin's alone.

Two security groups hold it on a ParallelCluster head node. ParallelCluster's own group takes
`HeadNode.Ssh.AllowedIps`, ONE IPv4 CIDR or prefix list, and opens port 22 to 0.0.0.0/0 when it is
left out; pcflow's head group (the network stage's, attached as `AdditionalSecurityGroups`) takes every
configured CIDR. So AllowedIps is the first IPv4 CIDR of the list, and the head node accepts SSH from
exactly the list. An empty list would leave ParallelCluster's default, so a ParallelCluster run is
refused without one; the whole internet passes only where the admin's profile says so explicitly.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from pcflow.errors import ConfigurationError

ANYWHERE = ("0.0.0.0/0", "::/0")
SETTING = "network.ssh_ingress_cidrs"


def refuse_anywhere(cidrs: Iterable[str], allowed: bool, setting: str) -> None:
    """0.0.0.0/0 (or ::/0) only with the explicit `allow_ssh_from_anywhere: true` beside it."""
    if allowed:
        return
    for cidr in cidrs:
        if str(ipaddress.ip_network(cidr, strict=False)) in ANYWHERE:
            raise ConfigurationError(
                f"{setting} contains {cidr} (SSH open to the internet); give the CIDR the Airflow workers "
                "connect from (their egress) or your VPN's instead, or set allow_ssh_from_anywhere=True if "
                "you really mean it (the deployment admin, in the profile)"
            )


def head_node_allowed_ips(cidrs: Iterable[str]) -> str:
    """ParallelCluster's `HeadNode.Ssh.AllowedIps`: the first IPv4 CIDR of `network.ssh_ingress_cidrs`
    (the others reach the head node through pcflow's head security group)."""
    cidrs = list(cidrs)
    if not cidrs:
        raise ConfigurationError(
            f"{SETTING} is empty: a ParallelCluster head node would then take SSH from anywhere "
            "(ParallelCluster's default AllowedIps, 0.0.0.0/0); the deployment admin sets it in the profile "
            "to the CIDR(s) the Airflow workers connect from (their egress: NAT gateway or elastic IP /32, "
            "VPC or VPN range); see docs/deploy.md, 'Network'"
        )
    for cidr in cidrs:
        if ipaddress.ip_network(cidr, strict=False).version == 4:
            return cidr
    raise ConfigurationError(
        f"{SETTING} {cidrs} has no IPv4 range: ParallelCluster's HeadNode.Ssh.AllowedIps takes an IPv4 CIDR "
        "(left out, it allows 0.0.0.0/0); the deployment admin adds the Airflow workers' IPv4 egress"
    )
