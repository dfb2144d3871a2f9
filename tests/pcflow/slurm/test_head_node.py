"""One value for the head node (connection id, address, pinned host key): what template fields, XCom and
trigger kwargs hold turns into it, an operator renders it field by field, the provider's hook is given
it when made (strict host key checking), and a trigger stored before it existed still loads."""

from __future__ import annotations

import json

import pytest
from airflow.sdk import Param

from pcflow.slurm.head_node import HeadNode
from pcflow.slurm.hook import SlurmHook

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
OTHER_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB7Z5zFz6xJk3Q4mRjdGzL1W8cEoF6P4+2mX0S7yqVbT"


def test_what_fields_and_xcom_hold_becomes_one_head_node():
    pinned = HeadNode("c", "10.0.0.5", KEY)
    assert HeadNode.of(pinned) == pinned
    assert HeadNode.of({"conn_id": "c", "address": "10.0.0.5", "host_key": f"{KEY} root@head"}) == pinned
    assert HeadNode.of(pinned.as_dict()) == pinned and json.loads(json.dumps(pinned.as_dict())) == pinned.as_dict()
    assert HeadNode.of(["c", "10.0.0.5", KEY]) == pinned  # how a DAG's serialised fields keep it
    assert HeadNode.of("c") == HeadNode("c") and HeadNode.of(None) == HeadNode("slurm_default")
    assert HeadNode("c", "", "").normalized() == HeadNode("c")  # a rendered empty value: the connection's own
    cluster = {"ssh_conn_id": "c", "head_node": {"address": "10.0.0.5", "host_key": KEY}}
    assert HeadNode.from_cluster(cluster) == pinned
    assert HeadNode.from_cluster({"ssh_conn_id": "c", "head_node": None}) == HeadNode("c")
    with pytest.raises(ValueError, match="unknown fields"):
        HeadNode.of({"conn_id": "c", "remote_host": "10.0.0.5"})
    with pytest.raises(ValueError, match="<type> <base64>"):
        HeadNode.of({"conn_id": "c", "host_key": "AAAA"})


def test_an_operator_renders_its_head_node_field_by_field():
    from pcflow.slurm.operators import SlurmJobOperator

    templated = HeadNode("{{ params.conn }}", "{{ params.address }}", "{{ params.key }}")
    op = SlurmJobOperator(task_id="t", program=["true"], head_node=templated, params={"conn": Param("c")})
    op.render_template_fields({"params": {"conn": "c", "address": "10.0.0.5", "key": KEY}})
    assert op.head_node == HeadNode("c", "10.0.0.5", KEY) and op.ssh_conn_id == "c"
    from_xcom = SlurmJobOperator(task_id="x", program=["true"], head_node={"conn_id": "c", "address": None})
    assert HeadNode.of(from_xcom.head_node) == HeadNode("c")
    assert SlurmJobOperator(task_id="s", program=["true"], ssh_conn_id="c").ssh_conn_id == "c"  # as before
    parts = SlurmJobOperator(task_id="p", program=["true"], ssh_conn_id="c", remote_host="10.0.0.5", host_key=KEY)
    assert parts.head_node == HeadNode("c", "10.0.0.5", KEY)  # the three arguments it replaces, as before
    with pytest.raises(ValueError, match="not both"):
        SlurmJobOperator(task_id="b", program=["true"], head_node="c", ssh_conn_id="c")
    with pytest.raises(ValueError, match="unreadable"):  # a literal value is checked when the DAG is parsed
        SlurmJobOperator(task_id="k", program=["true"], head_node=HeadNode("c", "h", "ssh-ed25519 !!"))


@pytest.fixture
def connection(monkeypatch):
    """A connection as an admin makes one for ParallelCluster: login and key file, no host key."""

    def make(conn_id: str, **extra) -> str:
        conn = {"conn_type": "ssh", "host": "203.0.113.1", "login": "pcflow", "port": 2222, "extra": extra}
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))
        return conn_id

    return make


@pytest.mark.security
def test_the_provider_hook_is_made_with_the_address_and_key_pinned(connection):
    hook = SlurmHook(HeadNode(connection("dynamic"), "10.0.0.5", KEY)).ssh_hook
    assert hook.remote_host == "10.0.0.5" and hook.port == 2222 and hook.username == "pcflow"
    assert f"{hook.host_key.get_name()} {hook.host_key.get_base64()}" == KEY and hook.no_host_key_check is False
    # A connection that says not to check gets checked all the same once a key is pinned.
    lax = SlurmHook(HeadNode(connection("lax", no_host_key_check=True), "10.0.0.5", KEY)).ssh_hook
    assert lax.no_host_key_check is False and lax.host_key is not None
    # The admin's own pinned key wins over one the run found (the same in the async hook).
    admin = SlurmHook(HeadNode(connection("admin", host_key=OTHER_KEY), "10.0.0.5", KEY)).ssh_hook
    assert f"{admin.host_key.get_name()} {admin.host_key.get_base64()}" == OTHER_KEY
    # No key anywhere: nothing is trusted on first use (paramiko refuses an unknown host).
    unpinned = SlurmHook(HeadNode(connection("unpinned"))).ssh_hook
    assert unpinned.host_key is None and unpinned.no_host_key_check is False


@pytest.mark.security
def test_checking_off_and_no_key_pinned_is_refused(connection):
    from pcflow.slurm.hook import HostKeyNotPinned

    with pytest.raises(HostKeyNotPinned, match="pins no key"):
        SlurmHook(HeadNode(connection("open", no_host_key_check=True))).ssh_hook  # noqa: B018
    # the admin's own key with checking off: checked all the same (the provider would refuse both set)
    both = SlurmHook(HeadNode(connection("both", host_key=OTHER_KEY, no_host_key_check="true"))).ssh_hook
    assert both.no_host_key_check is False and both.host_key.get_base64() == OTHER_KEY.split()[1]


@pytest.mark.security
def test_the_async_hook_pins_the_run_s_key_whatever_the_connection_says(connection):
    """The triggerer's hook: `no_host_key_check` made it trust any server (known_hosts "none"), dropping
    the key the run pinned."""
    import asyncio

    from airflow.providers.common.compat.connection import get_async_connection

    from pcflow.slurm.hook import HeadNodeSSHHookAsync

    def known_hosts(head_node: HeadNode) -> bytes | str:
        hook = HeadNodeSSHHookAsync(head_node)
        hook._parse_extras(asyncio.run(get_async_connection(head_node.conn_id)))
        return hook.known_hosts

    lax = HeadNode(connection("lax", no_host_key_check=True), "10.0.0.5", KEY)
    assert known_hosts(lax) == f"10.0.0.5 {KEY}".encode()
    admin = HeadNode(connection("admin", host_key=OTHER_KEY, no_host_key_check=True), "10.0.0.5", KEY)
    assert known_hosts(admin) == f"10.0.0.5 {OTHER_KEY}".encode()


PREVIOUS_KWARGS = {  # SlurmJobTrigger.serialize() of pcflow before HeadNode
    "ssh_conn_id": "slurm_default",
    "job_id": "42",
    "run_dir": "/shared/runs/r/train",
    "remote_host": "10.0.0.5",
    "host_key": KEY,
    "accounting": True,
    "slurm_bin": "/opt/slurm/bin",
    "policy": {"poll_interval": 1.0},
    "max_reconnect_attempts": 8,
    "command_timeout": 60.0,
    "early_stopping": None,
    "budget": None,
}


@pytest.mark.parametrize(
    ("classpath", "own"),
    [
        ("pcflow.slurm.trigger.SlurmJobTrigger", {"log_offset": 128}),
        ("pcflow.slurm.trigger.SlurmArrayTrigger", {"size": 3, "min_success_ratio": 0.5}),
        ("pcflow.metrics.early_stop.EarlyStoppingTrigger", {"element": 1, "early_stopping": {"patience": 3}}),
    ],
)
def test_a_trigger_stored_by_the_previous_version_still_loads(classpath, own):
    from airflow.sdk.module_loading import import_string

    stored = {**PREVIOUS_KWARGS, **own}
    trigger = import_string(classpath)(**stored)  # what the triggerer does with a stored row
    assert trigger.head_node == HeadNode("slurm_default", "10.0.0.5", KEY)
    path, kwargs = trigger.serialize()
    assert path == classpath and kwargs["head_node"] == trigger.head_node.as_dict()
    assert not {"ssh_conn_id", "remote_host", "host_key"} & set(kwargs)
    again = import_string(path)(**kwargs)
    assert again.serialize() == (path, kwargs)
    assert {k: kwargs[k] for k in own} == own
