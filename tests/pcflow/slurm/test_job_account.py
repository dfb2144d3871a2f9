"""Jobs run as the run's job account (a profile's `cluster.job_user`, `pcflow-job` on the local stack),
never as the SSH user: a hostile job tries to change the SSH user's files, the shared code and
environment, its own inputs and the run's directory, and to cancel-proof itself; each attempt fails,
the job still reports what it may write, and pcflow cancels it through sudo. Real sudo, real Slurm
(slurmd starts the job as that uid), real sshd and SFTP on the local stack."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import pwd
import shutil
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paramiko
import pytest
from airflow.sdk.exceptions import TaskDeferred
from stacktools import LocalStack
from taskcontext import make_context, run_to_end

from pcflow.metrics.harvest import read_tail
from pcflow.patterns import DEFAULT_JOB_USER
from pcflow.slurm.head_node import HeadNode
from pcflow.slurm.hook import SlurmHook, as_job_user, connect_async, with_slurm_bin
from pcflow.slurm.operators import SlurmJobOperator
from pcflow.slurm.payload import build_archive, ship
from pcflow.slurm.trigger import SlurmArrayTrigger, SlurmJobTrigger

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


#: The job replaces the files pcflow reads (its metrics, a decision pcflow had not written yet, the
#: array's `done` list) with links to files only the SSH user may read, and writes one file of its own.
LINKS = r"""
cat "$SECRETS/metrics.jsonl" >/dev/null 2>&1 && echo "job-reads-secret: DONE" || echo "job-reads-secret: refused"
ln -sf "$SECRETS/metrics.jsonl" "$PCFLOW_METRICS_FILE"
ln -sf "$SECRETS/metrics.jsonl" "$PCFLOW_RUN_DIR/utilisation.jsonl"
ln -sf "$SECRETS/metrics.jsonl" "$PCFLOW_RUN_DIR/done"
ln -sf "$SECRETS/marker.json" "$PCFLOW_RUN_DIR/budget_exhausted.json"
echo '{"step": 1, "loss": 0.5}' > "$PCFLOW_RUN_DIR/own.jsonl"
"""


@pytest.fixture
def secrets(local_stack: LocalStack) -> Iterator[Path]:
    """A directory only the SSH user enters (0700), for files the job account may not read."""
    path = local_stack.state_dir / f"secrets-{uuid.uuid4().hex[:8]}"
    path.mkdir(mode=0o700)
    yield path
    shutil.rmtree(path)


@pytest.mark.stack
def test_pcflow_never_reads_through_a_link_the_job_made(local_stack: LocalStack, secrets: Path):
    """About 10 s. What pcflow reads of a job's directory (worker and triggerer alike) is the job's own
    regular file or nothing: a link the job made to a file only the SSH user may read is not followed."""
    (secrets / "metrics.jsonl").write_text('{"step": 7, "loss": 123.25, "secret": "S3CR3T"}\n0 S3CR3T\n')
    (secrets / "marker.json").write_text('{"job_id": "1", "secret": "S3CR3T"}')
    op = SlurmJobOperator(
        task_id="train", program=["bash", "-c", LINKS], head_node=HEAD_NODE, env={"SECRETS": str(secrets)}, **FAST
    )
    result = run_to_end(op, make_context("train"))
    assert result["state"] == "COMPLETED", result
    run_dir = Path(result["run_dir"])
    assert "job-reads-secret: refused" in (run_dir / "job.log").read_text()
    assert (run_dir / "metrics.jsonl").is_symlink() and (run_dir / "metrics.jsonl").read_text()  # root reads it
    hook = SlurmHook(HEAD_NODE)
    try:
        assert hook.read_file(str(run_dir / "own.jsonl")) == b'{"step": 1, "loss": 0.5}\n'  # its own: read
        for name in ("metrics.jsonl", "utilisation.jsonl", "done"):
            assert hook.read_file(str(run_dir / name)) == b""
            assert read_tail(hook, str(run_dir / name), 1 << 20).data == b""
        assert hook.read_json(str(run_dir / "budget_exhausted.json")) is None
    finally:
        hook.close()
    assert asyncio.run(read_over_ssh(run_dir)) == {
        "own.jsonl": b'{"step": 1, "loss": 0.5}\n', "metrics.jsonl": None, "done": None, "budget_exhausted.json": None
    }  # fmt: skip


class SwappingSftp:
    """An SFTP client whose name shows the job's regular file, while what it opens is another's file: the
    job swapped a link in between pcflow's two calls."""

    def __init__(self, named: paramiko.SFTPAttributes, opened: paramiko.SFTPAttributes) -> None:
        self.named, self.opened = named, opened

    def lstat(self, path: str) -> paramiko.SFTPAttributes:
        return self.named

    def open(self, path: str, mode: str) -> Any:
        opened = self.opened

        class Handle(io.BytesIO):
            def stat(self) -> paramiko.SFTPAttributes:
                return opened

            def readv(self, pieces: list[tuple[int, int]]) -> list[bytes]:
                return [b"S3CR3T"]

        return Handle()


def attributes(mode: int, uid: int) -> paramiko.SFTPAttributes:
    attrs = paramiko.SFTPAttributes()
    attrs.st_mode, attrs.st_uid, attrs.st_gid, attrs.st_size = mode, uid, uid, 6
    return attrs


def test_a_file_swapped_between_its_status_and_its_opening_is_not_read(monkeypatch, caplog):
    """The name's own status (lstat) is checked before the open and compared with the opened file's after
    it: a link, a FIFO, or a swap to another owner's file is not read, and the log says why."""
    hook = SlurmHook(HEAD_NODE)
    job_file, ssh_users = attributes(stat.S_IFREG | 0o660, 2950), attributes(stat.S_IFREG | 0o600, 0)
    cases = {
        "swapped": (job_file, ssh_users, "changed between its status and its opening"),
        "link": (attributes(stat.S_IFLNK | 0o777, 2950), ssh_users, "is a link"),
        "fifo": (attributes(stat.S_IFIFO | 0o660, 2950), job_file, "is not a regular file"),
    }
    for named, opened, why in cases.values():
        monkeypatch.setattr(SlurmHook, "sftp", SwappingSftp(named, opened))
        assert hook.read_file("/run/metrics.jsonl") == b""
        assert why in caplog.text
    monkeypatch.setattr(SlurmHook, "sftp", SwappingSftp(job_file, job_file))
    assert hook.read_file("/run/metrics.jsonl") == b"S3CR3T"  # the job's own file: read


async def read_over_ssh(run_dir: Path) -> dict[str, bytes | None]:
    """The triggerer's reads (a marker's bytes, a metrics tail, the array's `done` list) over the stack's sshd."""
    conn = await connect_async(HEAD_NODE)
    try:
        async with conn.start_sftp_client() as sftp:
            own = await SlurmJobTrigger.read_tail(sftp, str(run_dir / "own.jsonl"), 1 << 20)
            array = SlurmArrayTrigger(job_id="1", size=2, run_dir=str(run_dir), head_node=HEAD_NODE)
            array.done_offset = 0
            return {
                "own.jsonl": own[0] if own else None,
                "metrics.jsonl": await SlurmJobTrigger.read_tail(sftp, str(run_dir / "metrics.jsonl"), 1 << 20),
                "done": (await array.read_done(sftp, 100)) or None,
                "budget_exhausted.json": await SlurmJobTrigger.read_bytes(sftp, str(run_dir / "budget_exhausted.json")),
            }
    finally:
        conn.close()


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
