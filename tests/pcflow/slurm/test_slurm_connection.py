"""The head node's connection: of pcflow's `slurm` type as its form stores it, or of the SSH provider's
`ssh` type as connections were written before pcflow was a provider; both read the same (no SSH here)."""

from __future__ import annotations

import json

import pytest

from pcflow.slurm.hook import SlurmHook

HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ0iBZTeNh2FBcqJQ4KwYV7WQdkVbY1NVAqY7pm8A5dP"


def connection(monkeypatch, conn_type: str, extra: dict) -> SlurmHook:
    document = {"conn_type": conn_type, "host": "10.0.1.23", "login": "ubuntu", "extra": extra}
    monkeypatch.setenv("AIRFLOW_CONN_HEAD_NODE", json.dumps(document))
    return SlurmHook("head_node")


@pytest.mark.parametrize("conn_type", ["slurm", "ssh"])
def test_the_extras_are_read_from_either_connection_type(monkeypatch, conn_type):
    extra = {"host_key": HOST_KEY, "shared_root": "/fsx", "slurm_bin": "/opt/slurm/bin", "key_file": "/k"}
    hook = connection(monkeypatch, conn_type, extra)
    assert hook.shared_root == "/fsx"
    assert hook._slurm_argv(["sbatch", "x"]) == ["/opt/slurm/bin/sbatch", "x"]
    pinned = hook.ssh_hook.host_key  # pinned, through the SSH provider's own extra
    assert f"{pinned.get_name()} {pinned.get_base64()}" == HOST_KEY
    assert hook.ssh_hook.no_host_key_check is False
    assert hook.login == "ubuntu"


def test_form_fields_left_empty_are_not_set(monkeypatch):
    """The form writes a field the admin left empty as null (or ""): the same as an absent extra."""
    hook = connection(monkeypatch, "slurm", {"host_key": None, "shared_root": "", "slurm_bin": None})
    assert hook.shared_root is None
    assert hook._slurm_argv(["squeue"]) == ["squeue"]
    assert hook.ssh_hook.host_key is None
    assert connection(monkeypatch, "slurm", {"host_key": ""}).ssh_hook.host_key is None


def test_the_hook_names_its_connection_type():
    assert (SlurmHook.conn_type, SlurmHook.conn_name_attr, SlurmHook.default_conn_name) == (
        "slurm",
        "ssh_conn_id",
        "slurm_default",
    )
