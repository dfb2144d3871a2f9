"""`HeadNode`: how to reach a Slurm head node, as one value (connection id, address, pinned host key,
and the account the run's jobs run as there).

A cluster pcflow created itself has an address and a host key known only at run time: both travel
with the connection id in this one value, from the cluster task's XCom to every task and trigger that
talks to the head node, so the key is always pinned, never trusted on first use. A host key is public:
the value may be stored in XCom, a trigger's kwargs or a rendered field.

A NamedTuple, so an operator's template field holding one is rendered field by field (Airflow rebuilds
named tuples) and stays immutable. Nothing here imports paramiko: DAG files use it. `SlurmHook(head_node)`
is where one becomes a hook (the hook knows this value; the value does not know the hook).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any, NamedTuple

from pcflow.patterns import JOB_USER
from pcflow.slurm import DEFAULT_SSH_CONN_ID

FIELDS = ("conn_id", "address", "host_key", "job_user")


class HeadNode(NamedTuple):
    """The SSH connection to use, and what this run knows better than the connection: the head node's
    address and its host key (`<type> <base64>`); None leaves the connection's own. `job_user`: the
    account the SSH user submits and cancels the run's jobs as (the profile's `cluster.job_user`,
    through `sudo`), so a job cannot write the SSH user's files; None runs them as the SSH user."""

    conn_id: str = DEFAULT_SSH_CONN_ID
    address: str | None = None
    host_key: str | None = None
    job_user: str | None = None

    @classmethod
    def of(cls, value: HeadNode | Mapping[str, Any] | str | None) -> HeadNode:
        """A HeadNode from what a template field or XCom holds: a HeadNode, its dict, or a connection id."""
        if isinstance(value, HeadNode):
            return value.normalized()
        if value is None or value == "":
            return cls()
        if isinstance(value, str):
            return cls(value)
        if isinstance(value, Mapping):
            unknown = set(value) - set(FIELDS)
            if unknown:
                raise ValueError(f"head_node: unknown fields {sorted(unknown)} (fields: {', '.join(FIELDS)})")
            return cls(**value).normalized()
        if isinstance(value, (list, tuple)) and 1 <= len(value) <= len(FIELDS):
            return cls(*value).normalized()
        raise TypeError(f"head_node: a HeadNode, a dict of {', '.join(FIELDS)} or a connection id, got {value!r}")

    @classmethod
    def from_cluster(cls, cluster: Mapping[str, Any]) -> HeadNode:
        """The head node of a cluster task's XCom (`pcflow.cluster.info.ClusterInfo.to_xcom`)."""
        head = cluster.get("head_node") or {}
        return cls(cluster["ssh_conn_id"], head.get("address"), head.get("host_key")).normalized()

    def running_jobs_as(self, job_user: str | None) -> HeadNode:
        """This head node, its jobs run as `job_user` (the run's `cluster.job_user`)."""
        return self._replace(job_user=job_user).normalized()

    def normalized(self) -> HeadNode:
        """Empty strings (a rendered None) read as "the connection's own"; the key as `<type> <base64>`
        (a known_hosts or console line's comment dropped), refused when it is not one; a job user that is
        not a user name is refused (it reaches sudo's command line)."""
        key = host_key_text(self.host_key) if self.host_key else None
        if self.job_user and not JOB_USER.fullmatch(self.job_user):
            raise ValueError(f"head_node.job_user {self.job_user!r} is not a user name")
        return HeadNode(self.conn_id or DEFAULT_SSH_CONN_ID, self.address or None, key, self.job_user or None)

    def as_dict(self) -> dict[str, str | None]:
        """For XCom and trigger kwargs (JSON)."""
        return dict(zip(FIELDS, self.normalized(), strict=True))


def host_key_text(text: str) -> str:
    """`ssh-ed25519 AAAA...` (as in known_hosts or cloud-init's console output), without what follows."""
    parts = text.split()
    if len(parts) < 2:
        raise ValueError(f"a host key is '<type> <base64>', got {text!r}")
    try:
        base64.b64decode(parts[1], validate=True)
    except binascii.Error as exc:
        raise ValueError(f"unreadable SSH host key {text[:40]!r}...: {exc}") from None
    return f"{parts[0]} {parts[1]}"


def head_node_argument(
    head_node: Any = None, ssh_conn_id: Any = None, remote_host: Any = None, host_key: Any = None
) -> Any:
    """A `head_node` argument (of an operator, a hook, a trigger), checked now if it is known now.
    `ssh_conn_id`, `remote_host`, `host_key`: the three arguments it replaces, still accepted (operators'
    callers and triggers stored before HeadNode use them)."""
    from pcflow.values import known_at_run_time

    if (ssh_conn_id, remote_host, host_key) != (None, None, None):
        if head_node is not None:
            raise ValueError("give head_node, or ssh_conn_id/remote_host/host_key as before it, not both")
        head_node = HeadNode(ssh_conn_id or DEFAULT_SSH_CONN_ID, remote_host, host_key)
    if head_node is None:
        return HeadNode()
    if not any(known_at_run_time(field) for field in own_values(head_node)):
        HeadNode.of(head_node)
    return head_node


def own_values(value: Any) -> list[Any]:
    """A head node argument's values, any of which may be known only at run time (a template, an XComArg)."""
    if isinstance(value, Mapping):
        return list(value.values())
    return list(value) if isinstance(value, HeadNode) else [value]
