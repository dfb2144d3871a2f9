"""The static provider: an existing Slurm cluster behind an SSH connection. Ensure = reachable and healthy
(`sinfo`: a partition up, nodes idle/mixed/allocated, GPUs where required); delete releases nothing."""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

from pcflow.cluster.info import ClusterInfo, Partition
from pcflow.errors import PcflowError, ServiceFailed
from pcflow.slurm.hook import HostKeyMismatch, SlurmConnectionError, SlurmError, SlurmHook

log = logging.getLogger(__name__)

#: One line per (node, partition): name|partition|partition availability|node state (long)|GRES.
SINFO_ARGV = ("sinfo", "--noheader", "--Node", "--format=%N|%R|%a|%T|%G")
USABLE_STATES = frozenset({"idle", "mixed", "allocated", "completing", "planned"})
# Suffixes sinfo appends to a state: * not responding, ~ powered off (cloud, usable), # powering up,
# ! powering down, % powering down, $ maintenance, @ reboot pending, ^ rebooting, - planned.
NOT_RESPONDING = "*"


class ClusterUnhealthy(ServiceFailed):
    """The cluster answered, but cannot run the job; the message says what is wrong and what to do."""


class ClusterUnreachable(PcflowError):
    """The head node could not be reached over SSH."""


def gpus_in_gres(gres: str) -> int:
    """`gpu:a100:8(S:0-1),shard:4` -> 8; `(null)` -> 0."""
    total = 0
    for item in gres.split(","):
        match = re.match(r"^gpu(?::[^:(]+)?:(\d+)", item.strip())
        if match:
            total += int(match.group(1))
    return total


def parse_sinfo(text: str) -> list[Partition]:
    """Partitions from `SINFO_ARGV`'s output, in first-seen order."""
    nodes: dict[str, list[tuple[str, int]]] = {}
    avail: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.strip().split("|")
        if len(parts) != 5:
            raise ValueError(f"unexpected sinfo line {line!r}")
        _node, partition, availability, state, gres = parts
        avail[partition] = availability
        nodes.setdefault(partition, []).append((state.lower(), gpus_in_gres(gres)))
    out = []
    for name, members in nodes.items():
        states = Counter(s for s, _ in members)
        usable = sum(1 for s, _ in members if _usable(s))
        gpus = max((g for s, g in members if _usable(s)), default=0)
        out.append(Partition(name, avail[name], len(members), usable, gpus, dict(states)))
    return out


def _usable(state: str) -> bool:
    if state.endswith(NOT_RESPONDING):
        return False
    base = state.rstrip("~#!%$@^-")
    return base in USABLE_STATES


def check_health(
    partitions: Iterable[Partition], *, partition: str | None = None, gpus_required: bool = False, min_nodes: int = 1
) -> list[Partition]:
    """The partitions that can run the job; raises `ClusterUnhealthy` saying why none can."""
    partitions = list(partitions)
    if not partitions:
        raise ClusterUnhealthy("sinfo lists no partitions: the cluster has no Slurm nodes configured")
    if partition is not None:
        partitions = [p for p in partitions if p.name == partition]
        if not partitions:
            raise ClusterUnhealthy(f"partition {partition!r} does not exist on the cluster; check the spec's partition")
    up = [p for p in partitions if p.state == "up"]
    if not up:
        raise ClusterUnhealthy(
            "no partition is up (" + ", ".join(f"{p.name}: {p.state}" for p in partitions) + "): ask the cluster "
            "admin to `scontrol update partitionname=... state=up`"
        )
    usable = [p for p in up if p.usable_nodes >= min_nodes]
    if not usable:
        detail = "; ".join(f"{p.name}: {p.node_states}" for p in up)
        raise ClusterUnhealthy(
            f"no partition has {min_nodes} usable node(s) (idle/mixed/allocated); node states: {detail}. Resume "
            "drained or down nodes (`scontrol update nodename=... state=resume`) or choose another cluster"
        )
    if gpus_required:
        with_gpus = [p for p in usable if p.gpus_per_node > 0]
        if not with_gpus:
            raise ClusterUnhealthy(
                "GPUs are required but no usable node has GPUs in its GRES ("
                + ", ".join(p.name for p in usable)
                + "): configure `Gres=gpu:N` on the nodes or set gpus_required=false"
            )
        usable = with_gpus
    return usable


class StaticProvider:
    """An existing Slurm cluster reached through `ssh_conn_id` (a SlurmHook connection)."""

    name = "static"

    def __init__(
        self,
        *,
        ssh_conn_id: str = "slurm_default",
        cluster_name: str | None = None,
        partition: str | None = None,
        gpus_required: bool = False,
        min_nodes: int = 1,
        hook: SlurmHook | None = None,
    ):
        self.ssh_conn_id = ssh_conn_id
        self.cluster_name = cluster_name
        self.partition = partition
        self.gpus_required = gpus_required
        self.min_nodes = min_nodes
        self._hook = hook

    @property
    def hook(self) -> SlurmHook:
        if self._hook is None:
            self._hook = SlurmHook(self.ssh_conn_id, connect_attempts=1)
        return self._hook

    def ensure(self, **_: Any) -> ClusterInfo:
        """The cluster's info when Slurm answers and a partition can run the job. An unreachable head node or
        unhealthy Slurm raises (retried); a host key mismatch is raised as it is, not retried."""
        hook = self.hook
        try:
            result = hook.run(list(SINFO_ARGV))
        except HostKeyMismatch:
            raise  # not "unreachable": the wrong machine answered, and no retry may try again
        except SlurmConnectionError as error:
            raise ClusterUnreachable(f"static cluster {self.ssh_conn_id!r} is unreachable: {error}") from error
        except SlurmError as error:
            raise ClusterUnhealthy(f"sinfo failed on {self.ssh_conn_id!r}: {error} (is slurmctld up?)") from error
        finally:
            hook.close()
        partitions = parse_sinfo(result.stdout)
        usable = check_health(
            partitions, partition=self.partition, gpus_required=self.gpus_required, min_nodes=self.min_nodes
        )
        log.info("static cluster %s healthy: %s", self.ssh_conn_id, ", ".join(p.name for p in usable))
        conn = hook.get_connection(self.ssh_conn_id)
        extras = conn.extra_dejson
        shared_root = extras.get("shared_root")
        return ClusterInfo(
            provider=self.name,
            name=self.cluster_name or conn.host or self.ssh_conn_id,
            head_node_address=conn.host,
            head_node_host_key=extras.get("host_key"),
            ssh_conn_id=self.ssh_conn_id,
            shared_root=shared_root,
            mounts=(shared_root,) if shared_root else (),
            partitions=tuple(partitions),
            adopted=True,
        )

    def delete(self, **_: Any) -> dict[str, Any]:
        """Nothing to release: the cluster is not pcflow's."""
        log.info("static cluster %s is not pcflow's: nothing to delete", self.ssh_conn_id)
        return {"provider": self.name, "deleted": False, "reason": "static clusters are never deleted by pcflow"}
