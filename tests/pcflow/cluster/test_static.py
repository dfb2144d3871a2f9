"""The static provider against the real local Slurm over sshd: healthy, GPUs missing, unreachable, and a
drained node on a PRIVATE stack (the shared node is never drained)."""

from __future__ import annotations

import json
import os
import socket
import subprocess

import pytest
from stacktools import read_env_file, stack_cli
from taskcontext import make_context

from pcflow.cluster.operators import DeleteClusterOperator, EnsureClusterOperator, ValidateClusterConfigOperator
from pcflow.cluster.static import ClusterUnhealthy, ClusterUnreachable, StaticProvider

pytestmark = pytest.mark.stack


def test_static_ensure_on_the_local_stack_returns_the_common_shape(local_stack):
    op = EnsureClusterOperator(task_id="ensure_cluster", provider="static", stack="unused", ssh_conn_id="slurm_default")
    info = op.execute(make_context("ensure_cluster"))
    assert info["provider"] == "static" and info["scheduler"] == "slurm"
    assert info["head_node"] == {
        "address": local_stack.slurm_connection["host"],
        "host_key": local_stack.slurm_connection["extra"]["host_key"],
    }
    assert info["shared_root"] == str(local_stack.shared_root) and info["mounts"] == [str(local_stack.shared_root)]
    compute = next(p for p in info["partitions"] if p["name"] == "compute")
    assert compute["state"] == "up" and compute["usable_nodes"] >= 1
    validate = ValidateClusterConfigOperator(task_id="validate_cluster", provider="static", stack="unused")
    assert validate.execute(make_context("validate_cluster"))["cluster"]["name"] == info["name"]
    delete = DeleteClusterOperator(task_id="delete_cluster", provider="static", stack="local")
    assert delete.execute(make_context("delete_cluster"))["deleted"] is False


def test_static_gpus_required_but_none_configured(local_stack):
    with pytest.raises(ClusterUnhealthy, match="GPUs are required"):
        StaticProvider(gpus_required=True).ensure()


def test_static_unreachable_host(local_stack, monkeypatch):
    conn = json.loads(os.environ["AIRFLOW_CONN_SLURM_DEFAULT"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        conn["port"] = s.getsockname()[1]  # closed once the socket is released
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_DOWN", json.dumps(conn))
    with pytest.raises(ClusterUnreachable, match="unreachable"):
        StaticProvider(ssh_conn_id="slurm_down").ensure()


def test_static_drained_node_on_a_private_stack(local_stack, tmp_path, monkeypatch):
    state = tmp_path / "stack"
    proc = stack_cli("up", state_dir=state)
    try:
        assert proc.returncode == 0, proc.stderr[-2000:]
        env = read_env_file(state / "env")
        monkeypatch.setenv("AIRFLOW_CONN_SLURM_PRIVATE", env["AIRFLOW_CONN_SLURM_DEFAULT"])
        assert StaticProvider(ssh_conn_id="slurm_private").ensure().partitions[0].usable_nodes == 3
        slurm_env = {**os.environ, "SLURM_CONF": env["SLURM_CONF"]}
        nodes = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N"], env=slurm_env, capture_output=True, text=True, check=True
        ).stdout.split()
        subprocess.run(
            ["scontrol", "update", f"nodename={nodes[0]}", "state=drain", "reason=pcflow-test"],
            env=slurm_env,
            check=True,
        )
        with pytest.raises(ClusterUnhealthy, match="usable node") as info:
            StaticProvider(ssh_conn_id="slurm_private", min_nodes=3).ensure()
        assert StaticProvider(ssh_conn_id="slurm_private", min_nodes=2).ensure().partitions[0].usable_nodes == 2
        assert "drain" in str(info.value) and "state=resume" in str(info.value)
    finally:
        stack_cli("down", state_dir=state)
