"""The compose `local` profile's init script, run here on the host (no Docker engine): it renders the
Slurm configs with the same renderer as include/local/stack.py, keeps the database password out of
argv and readable by its owner only, and writes connections that pin the login node's host key."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from slurmconf import POLICY, ComputeNode, SlurmdbdSite, SlurmSite, main, render_slurm_conf, render_slurmdbd_conf

REPO = Path(__file__).resolve().parents[2]


def settings(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith(("#", "Node", "Part")))


@pytest.fixture(scope="module")
def local_init(tmp_path_factory) -> Path:
    for program in ("ssh-keygen", "openssl", "python3"):
        if shutil.which(program) is None:
            pytest.skip(f"{program} not installed")
    root = tmp_path_factory.mktemp("pcflow-local")
    env = {
        "PATH": os.environ["PATH"],
        "PCFLOW_LOCAL_ROOT": str(root),
        "PCFLOW_SLURMCONF": str(REPO / "include" / "local" / "slurmconf.py"),
        "AIRFLOW_UID": str(os.getuid()),
        "SLURM_CPUS": "6",
        "SLURM_MEMORY_MB": "2048",
        "SLURM_DB_PASSWORD": "db-password-from-env",
    }
    proc = subprocess.run(
        ["bash", str(REPO / "docker" / "slurm" / "init.sh")], env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root


def test_init_renders_the_same_policy_as_the_host_stack(local_init):
    text = (local_init / "slurm" / "slurm.conf").read_text()
    rendered = settings(text)
    assert {k: rendered[k] for k in POLICY} == POLICY
    assert rendered["SlurmctldHost"] == "slurmctld" and rendered["AccountingStorageHost"] == "slurmdbd"
    for node in ("node1", "node2", "node3"):  # the compose services of those names
        assert f"NodeName={node} CPUs=6 RealMemory=2048 State=UNKNOWN" in text.splitlines()
    # The host stack's file differs only in where things are (ports, paths, the private munge socket).
    host = settings(
        render_slurm_conf(
            SlurmSite(
                controller="h",
                nodes=(ComputeNode("n1", "127.0.0.2", 7001),),
                cpus=4,
                memory_mb=1024,
                munge_socket="/s",
                loopback_only=True,
            )
        )
    )
    assert set(rendered) <= set(host)
    assert set(host) - set(rendered) == {"AuthInfo", "CommunicationParameters", "AccountingStoragePass"}


def test_init_keeps_the_database_password_private(local_init):
    dbd = local_init / "slurm" / "slurmdbd.conf"
    assert stat.S_IMODE(dbd.stat().st_mode) == 0o600
    assert settings(dbd.read_text())["StoragePass"] == "db-password-from-env"
    connections = json.loads((local_init / "connections.json").read_text())
    host_key = (local_init / "ssh" / "ssh_host_ed25519_key.pub").read_text().split()[:2]
    assert connections["slurm_default"]["extra"]["host_key"] == " ".join(host_key)
    assert connections["slurm_default"]["extra"]["no_host_key_check"] is False
    assert connections["aws_default"]["extra"]["verify"] == f"{local_init}/tls/ca.pem"


def test_renderer_refuses_bad_input(monkeypatch, capsys):
    monkeypatch.delenv("SLURM_DB_PASSWORD", raising=False)
    assert main(["slurmdbd", "--dbd-host", "slurmdbd", "--storage-host", "mariadb"]) == 2
    assert "SLURM_DB_PASSWORD" in capsys.readouterr().err
    assert main(["slurm", "--controller", "c", "--nodes", "n1,n p", "--cpus", "4", "--memory-mb", "64"]) == 2
    assert "node must be a non-empty word" in capsys.readouterr().err
    assert main(["slurm", "--controller", "c", "--nodes", "n1,n1", "--cpus", "4", "--memory-mb", "64"]) == 2
    assert "unique" in capsys.readouterr().err
    with pytest.raises(ValueError, match="positive"):
        SlurmSite(controller="c", nodes=(ComputeNode("n"),), cpus=0, memory_mb=64)
    with pytest.raises(ValueError, match="at least one compute node"):
        SlurmSite(controller="c", nodes=(), cpus=1, memory_mb=64)
    dbd = render_slurmdbd_conf(SlurmdbdSite(dbd_host="d", storage_host="m", storage_pass="p", dbd_port=7))
    assert "DbdPort=7" in dbd and "DbdAddr" not in dbd


def test_oci_conf_runs_every_step_through_the_sites_runtime():
    """oci.conf in Slurm 22.05's keys and patterns (no %U there: slurmstepd dies on it), the run through the
    stack's runtime wrapper, the other operations through runc with the same state; bad paths refused."""
    from slurmconf import render_oci_conf

    text = render_oci_conf("/opt/pcflow/oci-runtime.sh", "/var/lib/pcflow/runc")
    keys = dict(line.split("=", 1) for line in text.splitlines() if not line.startswith("#"))
    assert set(keys) == {"RunTimeQuery", "RunTimeKill", "RunTimeDelete", "RunTimeRun"}
    assert keys["RunTimeRun"] == '"/opt/pcflow/oci-runtime.sh /var/lib/pcflow/runc %b %n.%u.%j.%s.%t"'
    assert keys["RunTimeQuery"] == '"runc --rootless=true --root=/var/lib/pcflow/runc/%u state %n.%u.%j.%s.%t"'
    assert "%U" not in text
    for runtime, state in (("relative.sh", "/s"), ("/a b.sh", "/s"), ("/r.sh", '/s"x'), ("/r.sh", "/s%U")):
        with pytest.raises(ValueError, match="absolute path"):
            render_oci_conf(runtime, state)
