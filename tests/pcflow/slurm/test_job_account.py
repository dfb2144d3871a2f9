"""Jobs run as the run's job account (a profile's `cluster.job_user`, `pcflow-job` on the local stack),
never as the SSH user: a hostile job tries to change the SSH user's files, the shared code and
environment, its own inputs and the run's directory, and to cancel-proof itself; each attempt fails,
the job still reports what it may write, and pcflow cancels it through sudo. Real sudo, real Slurm
(slurmd starts the job as that uid), real sshd and SFTP on the local stack."""

from __future__ import annotations

import asyncio
import logging
import os
import pwd
import time
from pathlib import Path

import pytest
from airflow.sdk.exceptions import TaskDeferred
from stacktools import LocalStack
from taskcontext import make_context, run_to_end

from pcflow.patterns import DEFAULT_JOB_USER
from pcflow.slurm.head_node import HeadNode
from pcflow.slurm.hook import SlurmHook, as_job_user, connect_async, with_slurm_bin
from pcflow.slurm.operators import SlurmJobOperator
from pcflow.slurm.payload import build_archive, ship
from pcflow.slurm.trigger import SlurmJobTrigger

pytestmark = pytest.mark.security

FAST = {"poll_interval": 0.2, "confirm_interval": 2.0}
HEAD_NODE = HeadNode(job_user=DEFAULT_JOB_USER)

#: Each line `<what> <command...>`: the job runs the command and prints `<what>: refused` or `<what>: DONE`.
HOSTILE = r"""
attempt() { what=$1; shift; if "$@" 2>/dev/null; then echo "$what: DONE"; else echo "$what: refused"; fi; }
echo "whoami: $(id -un)"
attempt ssh-user-home touch "$SSH_HOME/pcflow-pwned"
attempt ssh-user-stack-state touch "$STACK_SSH/pcflow-pwned"
attempt payload-edit sh -c 'echo "import os" >> "$PAYLOAD/train.py"'
attempt payload-add touch "$PAYLOAD/pwned.py"
attempt payload-remove rm -f "$PAYLOAD/train.py"
attempt environment-add touch "$ENV_DIR/bin/pwned"
attempt hparams-edit sh -c 'echo "{\"lr\": 9}" > "$PCFLOW_HPARAMS"'
attempt hparams-replace sh -c 'echo "{}" > "$PCFLOW_RUN_DIR/h" && mv -f "$PCFLOW_RUN_DIR/h" "$PCFLOW_HPARAMS"'
attempt script-remove rm -f "$PCFLOW_RUN_DIR/job.sbatch"
attempt submitted-replace mv -f "$PCFLOW_RUN_DIR/spec.json" "$PCFLOW_RUN_DIR/submitted"
attempt run-dir-add touch "$(dirname "$PCFLOW_RUN_DIR")/planted"
attempt metrics-own sh -c 'echo "{\"step\": 1, \"loss\": 0.5}" >> "$PCFLOW_METRICS_FILE"'
attempt log-replace ln -sf "$STACK_SSH/ssh_host_ed25519_key" "$PCFLOW_RUN_DIR/job.log"
attempt link-plant ln -s "$STACK_SSH/ssh_host_ed25519_key" "$PCFLOW_RUN_DIR/early_stop.json"
echo "home: $HOME"
"""


@pytest.fixture(scope="module")
def job_account(local_stack: LocalStack) -> pwd.struct_passwd:
    """The account the local stack made for the local profile's jobs."""
    return pwd.getpwnam(DEFAULT_JOB_USER)


@pytest.fixture(scope="module")
def payload_dir(local_stack: LocalStack) -> str:
    """The simclr payload shipped as any run ships it: read-only, by content hash."""
    hook = SlurmHook(HEAD_NODE)
    try:
        shipped = ship(hook, build_archive("simclr"), shared_root=hook.shared_root, log=logging.getLogger("test"))
    finally:
        hook.close()
    return str(shipped["dir"])


@pytest.mark.stack
def test_a_hostile_job_runs_as_the_job_account_and_reaches_nothing_it_must_not(
    local_stack: LocalStack, job_account: pwd.struct_passwd, payload_dir: str
):
    """About 10 s. Every attempt on what the SSH user owns fails; what the job may write, it writes."""
    ssh_home = pwd.getpwnam(local_stack.slurm_connection["login"]).pw_dir
    env_dir = str(Path(os.environ.get("PCFLOW_PAYLOAD_VENV", Path(__file__).parents[3] / ".venv-payload")).resolve())
    before = {p: p.read_bytes() for p in Path(payload_dir).rglob("*") if p.is_file()}
    op = SlurmJobOperator(
        task_id="train",
        program=["bash", "-c", HOSTILE],
        head_node=HEAD_NODE,
        env={
            "PAYLOAD": payload_dir,
            "SSH_HOME": ssh_home,
            "STACK_SSH": str(local_stack.state_dir / "ssh"),
            "ENV_DIR": env_dir,
        },
        **FAST,
    )
    context = make_context("train")
    result = run_to_end(op, context)
    assert result["state"] == "COMPLETED", result
    run_dir = Path(result["run_dir"])
    log = (run_dir / "job.log").read_text()
    said = dict(line.split(": ", 1) for line in log.splitlines() if ": " in line and not line.startswith("pcflow"))
    assert said["whoami"] == DEFAULT_JOB_USER
    refused = [
        "ssh-user-home", "ssh-user-stack-state", "payload-edit", "payload-add", "payload-remove", "environment-add",
        "hparams-edit", "hparams-replace", "script-remove", "submitted-replace", "run-dir-add", "log-replace",
    ]  # fmt: skip
    assert {what: said[what] for what in refused} == dict.fromkeys(refused, "refused"), log
    assert said["metrics-own"] == "DONE" and said["link-plant"] == "DONE"
    assert said["home"] == f"{run_dir}/home"  # the account has none: caches go to the run's directory
    assert not (Path(ssh_home) / "pcflow-pwned").exists() and not (run_dir.parent / "planted").exists()
    assert {p: p.read_bytes() for p in Path(payload_dir).rglob("*") if p.is_file()} == before
    # What the job wrote is the job account's, in the run's group; what pcflow wrote stays pcflow's.
    assert (run_dir / "metrics.jsonl").stat().st_uid == job_account.pw_uid
    assert (run_dir / "hparams.json").stat().st_uid == os.getuid()
    assert (run_dir / "job.log").stat().st_uid == os.getuid() and not (run_dir / "job.log").is_symlink()
    assert (run_dir / "hparams.json").stat().st_gid == job_account.pw_gid
    assert oct(run_dir.stat().st_mode & 0o7777) == "0o3770" and oct(run_dir.parent.stat().st_mode & 0o7777) == "0o2750"

    # pcflow's decision written where the job planted a link to the host's private key: the link is
    # replaced, the key untouched.
    key = local_stack.state_dir / "ssh" / "ssh_host_ed25519_key"
    key_before = key.read_bytes()
    asyncio.run(write_decision_over_ssh(str(run_dir / "early_stop.json"), b'{"job_id": "1"}'))
    assert key.read_bytes() == key_before
    assert not (run_dir / "early_stop.json").is_symlink()
    assert (run_dir / "early_stop.json").read_bytes() == b'{"job_id": "1"}'


async def write_decision_over_ssh(path: str, data: bytes) -> None:
    """SlurmJobTrigger.write_decision over the local stack's sshd, as the triggerer writes early_stop.json."""
    conn = await connect_async(HEAD_NODE)
    try:
        async with conn.start_sftp_client() as sftp:
            await SlurmJobTrigger.write_decision(sftp, path, data)
    finally:
        conn.close()


@pytest.mark.stack
def test_pcflow_adopts_and_cancels_the_job_accounts_jobs_through_sudo(local_stack: LocalStack, job_account):
    """About 10 s: a running job of the job account is found as the run's (its user is the job account,
    not the SSH user), and the hook's cancel, as the job account, ends it."""
    op = SlurmJobOperator(task_id="train", program=["sleep", "300"], head_node=HEAD_NODE, **FAST)
    context = make_context("train")
    with pytest.raises(TaskDeferred):
        op.execute(context)
    (found,) = op.own_jobs(op.hook.find_jobs(op.job_name(context)))
    assert found.user == DEFAULT_JOB_USER and found.job_id == op.job_id
    op.hook.cancel(op.job_id)
    deadline = time.monotonic() + 60
    while (info := op.hook.job_info(op.job_id)) is not None and not info.state.is_terminal:
        assert time.monotonic() < deadline, info
        time.sleep(0.5)
    assert info is None or info.state.name == "CANCELLED"


@pytest.mark.stack
def test_a_job_account_sudo_refuses_fails_the_submit_and_says_so(local_stack: LocalStack):
    """A head node where the SSH user may not sudo to the job account (here: no such account) fails the
    submit with sudo's message, and nothing is submitted."""
    hook = SlurmHook(HeadNode(job_user="pcflow-nobody"))
    try:
        op = SlurmJobOperator(task_id="train", program=["true"], head_node=hook.head_node, **FAST)
        with pytest.raises(Exception, match="pcflow-nobody"):
            op.execute(make_context("train"))
    finally:
        hook.close()


def test_sudo_prefix_keeps_slurm_bin_on_the_slurm_command():
    """sudo's secure_path lacks a site's Slurm directory: the command after the prefix is made absolute."""
    argv = with_slurm_bin(as_job_user(["scancel", "7"], "pcflow-job"), "/opt/slurm/bin")
    assert argv == ["sudo", "-n", "-E", "-H", "-u", "pcflow-job", "--", "/opt/slurm/bin/scancel", "7"]
    assert as_job_user(["scancel", "7"], None) == ["scancel", "7"]
    with pytest.raises(ValueError, match="not a user name"):
        HeadNode(job_user="root;id").normalized()
