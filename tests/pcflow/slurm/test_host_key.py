"""A head node whose host key is not the pinned one: refused once, naming both keys by their SHA256
fingerprints as ssh prints them (the first characters of two ed25519 keys are the same header), and
never retried, by the connection or by Airflow."""

from __future__ import annotations

import json
import re
import subprocess

import paramiko
import pytest
from airflow.sdk.exceptions import AirflowFailException
from stacktools import LocalStack
from taskcontext import first_event, make_context

from pcflow.slurm.hook import HostKeyMismatch, SlurmHook
from pcflow.slurm.operators import SlurmJobOperator
from pcflow.slurm.trigger import SlurmJobTrigger

pytestmark = [pytest.mark.security, pytest.mark.stack]


def ssh_keygen_fingerprint(public_key_file) -> str:
    return subprocess.run(
        ["ssh-keygen", "-lf", str(public_key_file)], capture_output=True, text=True, check=True
    ).stdout.split()[1]


@pytest.fixture
def impostor(local_stack: LocalStack, monkeypatch) -> tuple[str, str, str]:
    """A connection pinning the wrong key (the client's own); the served and the pinned fingerprints."""
    ssh = local_stack.state_dir / "ssh"
    conn = json.loads(local_stack.env["AIRFLOW_CONN_SLURM_DEFAULT"])
    wrong = (ssh / "id_ed25519.pub").read_text().split()
    conn["extra"]["host_key"] = f"{wrong[0]} {wrong[1]}"
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_IMPOSTOR", json.dumps(conn))
    served = ssh_keygen_fingerprint(ssh / "ssh_host_ed25519_key.pub")
    pinned = ssh_keygen_fingerprint(ssh / "id_ed25519.pub")
    return "slurm_impostor", served, pinned


def test_worker_side_mismatch_fails_once_with_both_fingerprints(impostor, monkeypatch):
    conn_id, served, pinned = impostor
    attempts = []
    connect = paramiko.SSHClient.connect
    monkeypatch.setattr(paramiko.SSHClient, "connect", lambda self, **kw: attempts.append(1) or connect(self, **kw))

    with pytest.raises(HostKeyMismatch) as refused:
        SlurmHook(conn_id, connect_attempts=3).run(["true"])
    assert isinstance(refused.value, AirflowFailException)  # Airflow fails the task without retries
    assert served in str(refused.value) and pinned in str(refused.value) and served != pinned
    assert len(attempts) == 1

    op = SlurmJobOperator(task_id="impostor", program=["true"], ssh_conn_id=conn_id)
    with pytest.raises(AirflowFailException, match="does not match the key pinned"):
        op.execute(make_context("impostor"))


def test_triggerer_side_mismatch_is_not_retried(impostor):
    conn_id, served, pinned = impostor
    connects = []

    class CountingTrigger(SlurmJobTrigger):
        async def connect(self):
            connects.append(1)
            return await super().connect()

    trigger = CountingTrigger(ssh_conn_id=conn_id, job_id="1", run_dir="/nonexistent", max_reconnect_attempts=8)
    event = first_event(trigger)
    assert event["status"] == "error" and event["retryable"] is False
    assert served in event["message"] and pinned in event["message"]
    assert connects == [1]
    op = SlurmJobOperator(task_id="impostor", program=["true"], ssh_conn_id=conn_id)
    with pytest.raises(AirflowFailException, match=re.escape(served)):  # a fingerprint may hold '+'
        op.execute_complete(make_context("impostor"), event)
