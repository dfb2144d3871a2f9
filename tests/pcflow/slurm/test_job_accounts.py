"""Runs sharing a cluster lease different job accounts from its pool (pcflow.slurm.accounts), so one run's
job cannot read or change another's files, and a run's directory is closed when it gives its account
back, so the next run leasing that account cannot read what it left. Real leases on the local stack's
shared root over SSH, real jobs of the real accounts."""

from __future__ import annotations

import logging
import os
import subprocess
import uuid

import pytest
from stacktools import LocalStack
from taskcontext import make_context, run_to_end

from pcflow.dataset.stage_in import link_partition
from pcflow.naming import run_key_from_context
from pcflow.patterns import DEFAULT_JOB_USER, job_account_names
from pcflow.slurm.accounts import NoJobAccount, lease, lease_path, release
from pcflow.slurm.head_node import HeadNode
from pcflow.slurm.hook import SlurmHook
from pcflow.slurm.operators import SlurmJobOperator

pytestmark = pytest.mark.security

FAST = {"poll_interval": 0.2, "confirm_interval": 2.0}
POOL = job_account_names(DEFAULT_JOB_USER, 8)

#: A job of another run: each attempt on the first run's directory, `<what>: refused|DONE`.
PRYING = r"""
attempt() { what=$1; shift; if "$@" >/dev/null 2>&1; then echo "$what: DONE"; else echo "$what: refused"; fi; }
attempt list-run ls "$OTHER_RUN"
attempt read-hparams cat "$OTHER_RUN/train/hparams.json"
attempt read-metrics cat "$OTHER_RUN/train/metrics.jsonl"
attempt write-metrics sh -c 'echo "{\"loss\": 0}" >> "$OTHER_RUN/train/metrics.jsonl"'
attempt plant-model touch "$OTHER_RUN/train/model.pt"
"""
WRITES = 'echo "{\\"step\\": 1, \\"loss\\": 0.5}" >> "$PCFLOW_METRICS_FILE"'


def run_job(program: str, account: str, context: dict, env: dict | None = None, task: str = "train") -> dict:
    """One SlurmJobOperator run to its end as `account`: execute, the trigger's first event, execute_complete."""
    head_node = HeadNode(job_user=account)
    op = SlurmJobOperator(task_id=task, program=["bash", "-c", program], head_node=head_node, env=env, **FAST)
    return run_to_end(op, context)


def said(result: dict) -> dict[str, str]:
    """The `<what>: <answer>` lines of the job's log."""
    with open(f"{result['run_dir']}/job.log") as fh:
        return dict(line.rstrip("\n").split(": ", 1) for line in fh if ": " in line and not line.startswith("pcflow"))


@pytest.fixture
def hook(local_stack: LocalStack):
    hook = SlurmHook()
    yield hook
    hook.close()


@pytest.mark.stack
def test_leases_are_one_per_run_kept_on_retry_refused_when_all_are_held_and_freed_on_release(hook, tmp_path):
    root = hook.shared_root
    pool = [f"{DEFAULT_JOB_USER}-{i}" for i in (5, 6)]  # two of the stack's accounts: a pool of two
    keys = [f"test-{uuid.uuid4().hex[:12]}" for _ in range(3)]
    first = lease(hook, root, keys[0], pool)
    assert lease(hook, root, keys[0], pool) == first  # a retried task: the same account, nothing leased twice
    second = lease(hook, root, keys[1], pool)
    assert {first, second} == set(pool)
    with pytest.raises(NoJobAccount, match=r"all 2 job accounts .* are leased to runs that are still running"):
        lease(hook, root, keys[2], pool)
    run_dir = f"{root}/pcflow/runs/{keys[0]}"
    hook.makedirs(run_dir)
    release(hook, root, keys[1], first)  # not its lease: left alone
    with pytest.raises(NoJobAccount):
        lease(hook, root, keys[2], pool)
    assert release(hook, root, keys[0], first) == []
    assert lease(hook, root, keys[2], pool) == first
    assert hook.run(["stat", "-c", "%a", run_dir]).stdout.strip() == "700"  # closed to the account
    for key, account in ((keys[1], second), (keys[2], first)):
        release(hook, root, key, account)
    assert hook.run(["ls", f"{root}/pcflow/job-accounts"]).stdout.split() == []


@pytest.mark.stack
def test_an_account_held_by_a_run_that_is_over_is_reclaimed_and_no_other(hook):
    """A run that never released its account (its teardown never ran) loses it to the next run once Airflow
    says it is over; one still running, one whose state Airflow does not give, keep theirs."""
    root = hook.shared_root
    pool = [f"{DEFAULT_JOB_USER}-{i}" for i in (3, 4)]
    keys = {name: f"test-{name}-{uuid.uuid4().hex[:8]}" for name in ("over", "running", "next", "unknown")}
    states = {"over": "failed", "running": "running"}
    held = {name: lease(hook, root, keys[name], pool, dag_run=("pretrain", name)) for name in ("over", "running")}
    run_dir = f"{root}/pcflow/runs/{keys['over']}"
    hook.makedirs(run_dir)

    def run_is_over(dag_id: str, run_id: str) -> bool:
        assert dag_id == "pretrain"
        if run_id not in states:
            raise RuntimeError("the execution API did not answer")
        return states[run_id] not in ("queued", "running")

    with pytest.raises(NoJobAccount):  # without Airflow's word nothing is reclaimed
        lease(hook, root, keys["next"], pool, dag_run=("pretrain", "next"))
    assert lease(hook, root, keys["next"], pool, dag_run=("pretrain", "next"), run_is_over=run_is_over) == held["over"]
    assert hook.run(["stat", "-c", "%a", run_dir]).stdout.strip() == "700"  # closed, as its release would have
    assert hook.read_file(lease_path(root, held["running"])).decode().split("\n")[0] == keys["running"]
    # Held now by a run still running and one whose state Airflow does not give (no entry): both kept.
    with pytest.raises(NoJobAccount):
        lease(hook, root, keys["unknown"], pool, dag_run=("pretrain", "unknown"), run_is_over=run_is_over)
    for name in ("running", "next"):
        release(hook, root, keys[name], held.get(name) or held["over"])
    hook.run(["rm", "-rf", "--", run_dir])
    assert hook.run(["ls", f"{root}/pcflow/job-accounts"]).stdout.split() == []


@pytest.mark.stack
def test_an_account_with_a_job_still_running_stays_leased(local_stack: LocalStack, hook):
    root, key, account = hook.shared_root, f"test-{uuid.uuid4().hex[:12]}", f"{DEFAULT_JOB_USER}-7"
    assert lease(hook, root, key, [account]) == account
    argv = ["sudo", "-n", "-E", "-u", account, "sbatch", "--parsable", "--hold", "--chdir=/tmp", "--output=/dev/null"]
    env = {**os.environ, **local_stack.env}
    job = subprocess.run([*argv, "--wrap", "sleep 60"], env=env, check=True, capture_output=True, text=True)
    job_id = job.stdout.strip()
    try:
        assert release(hook, root, key, account) == [job_id]
        assert hook.read_file(lease_path(root, account)).decode().strip() == key
    finally:
        hook.cancel(job_id)  # the SSH user is root here: Slurm lets it
    hook.run(["rm", "-f", lease_path(root, account)])


@pytest.mark.stack
def test_one_run_s_job_cannot_reach_another_s_files_nor_the_next_run_s_what_it_left(local_stack: LocalStack, hook):
    """About 10 s: run A writes its metrics as one account; run B's job, another account, tries A's
    directory while A's files are there; A gives its account back, and run C, leasing it next, tries too."""
    root = hook.shared_root
    contexts = [make_context("train") for _ in range(3)]
    keys = [run_key_from_context(c) for c in contexts]
    pool = POOL[1:3]
    account_a = lease(hook, root, keys[0], pool)
    account_b = lease(hook, root, keys[1], pool)
    assert account_a != account_b
    a = run_job(WRITES, account_a, contexts[0])
    assert a["state"] == "COMPLETED"
    other = {"OTHER_RUN": f"{root}/pcflow/runs/{keys[0]}"}
    attempts = ("list-run", "read-hparams", "read-metrics", "write-metrics", "plant-model")
    # The control: another task of run A itself, on A's account, reaches A's files (the paths are right).
    probe = run_job(PRYING, account_a, make_context("probe", run_id=contexts[0]["run_id"]), other, task="probe")
    assert [said(probe)[what] for what in attempts[:4]] == ["DONE"] * 4
    b = run_job(PRYING, account_b, contexts[1], other)
    assert {what: said(b)[what] for what in attempts} == dict.fromkeys(attempts, "refused")

    assert release(hook, root, keys[0], account_a) == []
    assert lease(hook, root, keys[2], [account_a]) == account_a  # the next run on A's account
    c = run_job(PRYING, account_a, contexts[2], other)
    assert {what: said(c)[what] for what in attempts} == dict.fromkeys(attempts, "refused")
    for key, account in zip(keys[1:], (account_b, account_a), strict=True):
        release(hook, root, key, account)
    logging.getLogger("test").info("A %s, B %s, C %s", account_a, account_b, account_a)


@pytest.mark.stack
def test_a_job_reads_its_own_partition_through_its_run_and_no_other(local_stack: LocalStack, hook):
    """A static cluster keeps the partitions it was sent in a directory only the SSH user enters; a run's
    job reads its own through its run's view (hard links), not the copies, nor another run's view."""
    root = hook.shared_root
    copies = f"{root}/pcflow/datasets"
    hook.make_private_dirs(copies)
    dataset = f"{copies}/test-bucket/{uuid.uuid4().hex[:8]}"
    ours, theirs = (f"{dataset}/2026-12-0{i}" for i in (1, 2))
    hook.makedirs(ours, theirs)
    for partition in (ours, theirs):
        hook.write_file(f"{partition}/shard-000.txt", "pixels\n", mode=0o644)  # as stage-in's tar leaves it
    hook.run(["chmod", "0700", ours])  # as FSx imports a partition (pcflow.dataset.posix): the view opens it
    contexts = [make_context("train") for _ in range(2)]
    keys = [run_key_from_context(c) for c in contexts]
    accounts = [lease(hook, root, key, POOL[4:6]) for key in keys]
    views = []
    for key, account, partition in zip(keys, accounts, (ours, theirs), strict=True):
        run_hook = SlurmHook(HeadNode(job_user=account))
        run_hook.make_run_dirs(f"{root}/pcflow/runs/{key}")
        views.append(link_partition(run_hook, partition, f"{root}/pcflow/runs/{key}"))
        run_hook.close()
    probing = r"""
attempt() { what=$1; shift; if "$@" >/dev/null 2>&1; then echo "$what: DONE"; else echo "$what: refused"; fi; }
attempt own-view cat "$OWN/shard-000.txt"
attempt own-copy cat "$OURS/shard-000.txt"
attempt other-copy cat "$THEIRS/shard-000.txt"
attempt list-copies ls "$COPIES"
attempt other-view cat "$OTHER_VIEW/shard-000.txt"
"""
    env = {"OWN": views[0], "OURS": ours, "THEIRS": theirs, "COPIES": copies, "OTHER_VIEW": views[1]}
    try:
        job = run_job(probing, accounts[0], contexts[0], env)
    finally:
        released = [release(hook, root, key, account) for key, account in zip(keys, accounts, strict=True)]
    assert said(job) == {
        "own-view": "DONE",  # the control: the paths are right
        **dict.fromkeys(("own-copy", "other-copy", "list-copies", "other-view"), "refused"),
    }
    assert released == [[], []]
    assert not hook.is_dir(views[0])  # the view goes with the lease; the copies stay for the next run
    assert hook.read_file(f"{ours}/shard-000.txt") == b"pixels\n"
    hook.run(["rm", "-rf", "--", dataset])


def test_the_local_stack_makes_the_accounts_the_local_profile_leases():
    """include/local/stack.py and the local profile agree on the pool (names, as patterns names them)."""
    import stack as stack_script  # include/local/stack.py

    from pcflow.profiles import load_profile

    cluster = load_profile("local")["cluster"]
    names = job_account_names(cluster["job_user"], cluster["job_accounts"])
    assert [name for name, _ in stack_script.job_account_names()] == names
    assert [uid for _, uid in stack_script.job_account_names()] == list(range(2950, 2950 + len(names)))
