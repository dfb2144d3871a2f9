"""Reaching a head node: address and host key known only at run time (a new cluster), and a head
node that stops answering (the call fails within its limit, never hangs the task)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager

import psutil
import pytest

from pcflow.slurm.head_node import HeadNode
from pcflow.slurm.hook import HostKeyMismatch, SlurmConnectionError, SlurmHook, connect_async

pytestmark = pytest.mark.stack


@pytest.fixture
def unpinned_connection(local_stack, monkeypatch) -> tuple[str, str]:
    """A connection like one made for ParallelCluster: login and key, no host and no host key."""
    conn = json.loads(local_stack.env["AIRFLOW_CONN_SLURM_DEFAULT"])
    real_key = conn["extra"].pop("host_key")
    conn["host"] = "203.0.113.1"  # documentation range: must be overridden to work at all
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_DYNAMIC", json.dumps(conn))
    return "slurm_dynamic", real_key


def test_runtime_host_and_key_override_the_connection(unpinned_connection):
    conn_id, real_key = unpinned_connection
    hook = SlurmHook(HeadNode(conn_id, "127.0.0.1", real_key), connect_attempts=1)
    assert hook.run(["echo", "pinned"]).stdout == "pinned\n"
    hook.close()
    # Given to the provider's hook when it is made (the connection as the head node amends it), not after.
    assert hook.ssh_hook.remote_host == "127.0.0.1" and hook.ssh_hook.no_host_key_check is False
    assert hook.ssh_hook.host_key.get_base64() == real_key.split()[1]


def test_runtime_key_mismatch_is_refused(unpinned_connection, local_stack):
    conn_id, _ = unpinned_connection
    wrong = (local_stack.state_dir / "ssh" / "id_ed25519.pub").read_text()
    with pytest.raises(SlurmConnectionError, match="does not match the key pinned"):
        SlurmHook(HeadNode(conn_id, "127.0.0.1", wrong), connect_attempts=1).run(["true"])


def test_no_key_at_all_is_refused_not_trusted_on_first_use(unpinned_connection):
    conn_id, _ = unpinned_connection
    with pytest.raises(SlurmConnectionError):
        SlurmHook(HeadNode(conn_id, "127.0.0.1"), connect_attempts=1).run(["true"])


def test_async_hook_pins_the_runtime_key(unpinned_connection, local_stack):
    conn_id, real_key = unpinned_connection
    wrong = (local_stack.state_dir / "ssh" / "id_ed25519.pub").read_text()

    async def connect(key: str) -> str:
        conn = await connect_async(HeadNode(conn_id, "127.0.0.1", key))
        async with conn:
            return (await conn.run("echo async", check=True)).stdout

    assert asyncio.run(connect(real_key)) == "async\n"
    with pytest.raises(HostKeyMismatch, match="does not match the key pinned"):
        asyncio.run(connect(wrong))


def test_a_malformed_host_key_is_refused():
    with pytest.raises(ValueError, match="<type> <base64>"):
        SlurmHook(HeadNode("slurm_default", "10.0.0.1", "AAAA"))
    with pytest.raises(ValueError, match="unreadable"):
        SlurmHook({"conn_id": "slurm_default", "host_key": "ssh-ed25519 not-base64!"})


@contextmanager
def stalled(hook: SlurmHook) -> Iterator[None]:
    """Freeze the sshd process that serves this hook's connection (other connections still work)."""
    client_port = hook.get_conn().get_transport().sock.getsockname()[1]
    (server,) = {c.pid for c in psutil.net_connections(kind="tcp") if c.raddr and c.raddr.port == client_port and c.pid}
    os.kill(server, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server, signal.SIGCONT)


def test_a_stalled_head_node_fails_the_call_and_the_next_call_reconnects(local_stack):
    hook = SlurmHook(command_timeout=2)
    try:
        marker = local_stack.shared_root / "stall-probe.txt"
        marker.write_text("probe")
        assert hook.read_file(str(marker)) == b"probe"
        with stalled(hook), pytest.raises(SlurmConnectionError, match=r"did not answer the read of .*stall-probe"):
            hook.read_file(str(marker))
        assert hook.run(["echo", "back"]).stdout == "back\n"
        with stalled(hook):  # the channel never opens: the command cannot have run, so one reconnect
            assert hook.run(["echo", "again"]).stdout == "again\n"

        with pytest.raises(SlurmConnectionError, match=r"did not answer `sleep 30` within 1 s"):
            hook.run(["sleep", "30"], timeout=1)
        assert hook.read_file(str(marker)) == b"probe"
    finally:
        hook.close()
