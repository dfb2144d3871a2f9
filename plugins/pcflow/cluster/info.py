"""`ClusterInfo`: what every provider's "ensure" returns, as a plain JSON dict for XCom.

The Slurm job stage connects with `SlurmHook(info["ssh_conn_id"])`, overriding the host with
`head_node.address` and pinning `head_node.host_key` when they are set (ParallelCluster: the head node
is new, so its address and key come from here, never from trust-on-first-use).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Partition:
    """A Slurm partition as `sinfo` saw it: `usable_nodes` counts nodes that can take a job now (not down,
    drained or unresponsive), and `gpus_per_node` is the most GPUs such a node has."""

    name: str
    state: str  # up | down | drain | inact
    nodes: int = 0
    usable_nodes: int = 0
    gpus_per_node: int = 0
    node_states: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ClusterInfo:
    """What a provider's ensure found: how to reach the head node (connection id, and for a cluster made at run
    time its address and pinned host key), the shared root and the partitions. The same shape for every
    provider, so the job stage never asks which one ran."""

    provider: str
    name: str
    head_node_address: str | None
    head_node_host_key: str | None
    ssh_conn_id: str
    shared_root: str | None
    mounts: tuple[str, ...] = ()
    partitions: tuple[Partition, ...] = ()
    config_hash: str | None = None
    scheduler: str = "slurm"
    status: str = "ready"
    adopted: bool = False
    #: What every job on it exports for its network (EFA's libfabric settings, pcflow.cluster.fabric); {}: none.
    fabric_env: Mapping[str, str] = field(default_factory=dict)

    def to_xcom(self) -> dict[str, Any]:
        """JSON for the ensure task's XCom; `HeadNode.from_cluster` and `from_xcom` read it back."""
        return {
            "provider": self.provider,
            "name": self.name,
            "scheduler": self.scheduler,
            "status": self.status,
            "head_node": {"address": self.head_node_address, "host_key": self.head_node_host_key},
            "ssh_conn_id": self.ssh_conn_id,
            "shared_root": self.shared_root,
            "mounts": list(self.mounts),
            "partitions": [asdict(p) for p in self.partitions],
            "config_hash": self.config_hash,
            "adopted": self.adopted,
            "fabric_env": dict(self.fabric_env),
        }

    @classmethod
    def from_xcom(cls, value: dict[str, Any]) -> ClusterInfo:
        """The ClusterInfo `to_xcom` wrote; a field it lacks takes its default."""
        head = value.get("head_node") or {}
        return cls(
            provider=value["provider"],
            name=value["name"],
            head_node_address=head.get("address"),
            head_node_host_key=head.get("host_key"),
            ssh_conn_id=value["ssh_conn_id"],
            shared_root=value.get("shared_root"),
            mounts=tuple(value.get("mounts", ())),
            partitions=tuple(Partition(**p) for p in value.get("partitions", ())),
            config_hash=value.get("config_hash"),
            scheduler=value.get("scheduler", "slurm"),
            status=value.get("status", "ready"),
            adopted=bool(value.get("adopted", False)),
            fabric_env=dict(value.get("fabric_env") or {}),
        )
