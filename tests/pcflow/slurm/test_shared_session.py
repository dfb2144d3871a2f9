"""Many waits on one head node share one SSH connection, survive its loss together, and tell their task
logs how their jobs are doing. Against the local stack's real Slurm and sshd; the waits run as the
triggerer runs them: each trigger's run() in its own task of one event loop, its log context bound."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import signal
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import structlog
from stacktools import LocalStack
from taskcontext import deferred_trigger, first_event, make_context

from pcflow.slurm.hook import SlurmHook
from pcflow.slurm.operators import SlurmArrayJobOperator, SlurmJobOperator
from pcflow.slurm.session import HeadNodeSession, current_sessions
from pcflow.slurm.trigger import HeadNodeTrigger

pytestmark = pytest.mark.stack

FAST = {"poll_interval": 0.2, "confirm_interval": 2.0}
WAITS = 20


#: Each job waits for the test's go file (two minutes at most): all waits are in flight before any job ends.
GATE = 'for _ in $(seq 600); do [ -e "$2" ] && break; sleep 0.2; done; '


def submit_many(script: str, gate: Path, count: int = WAITS) -> list[HeadNodeTrigger]:
    """`count` train tasks deferred (`$1` in `script` is the index), submitted by four worker threads."""
    local, hooks = threading.local(), []

    def submit(i: int) -> HeadNodeTrigger:
        if not hasattr(local, "hook"):
            local.hook = SlurmHook()
            hooks.append(local.hook)
        program = ["bash", "-c", GATE + script, "bash", str(i), str(gate)]
        op = SlurmJobOperator(task_id=f"many-{i}", program=program, **FAST)
        op.hook = local.hook
        return deferred_trigger(op, make_context(f"many-{i}"))

    try:
        with ThreadPoolExecutor(4) as pool:
            return list(pool.map(submit, range(count)))
    finally:
        for hook in hooks:
            hook.close()


async def connected_session() -> HeadNodeSession:
    """The waits' session, once it has connected."""
    while not current_sessions() or current_sessions()[0].connections_opened == 0:
        await asyncio.sleep(0.1)
    return current_sessions()[0]


def accepted_connections(stack: LocalStack) -> int:
    """SSH connections sshd authenticated so far, from its own log."""
    return (stack.state_dir / "logs" / "sshd.log").read_text(errors="replace").count("Accepted publickey")


async def wait_like_a_triggerer(triggers: list[HeadNodeTrigger]) -> list[dict]:
    async def one(trigger_id: int, trigger: HeadNodeTrigger) -> dict:
        structlog.contextvars.bind_contextvars(trigger_id=trigger_id)  # as the triggerer's run_trigger does
        async for event in trigger.run():
            return event.payload
        raise AssertionError("trigger ended without an event")

    return await asyncio.gather(*(one(i, t) for i, t in enumerate(triggers)))


def test_twenty_waits_share_one_connection_and_each_streams_its_own_log(local_stack, tmp_gate, capsys):
    """About 40 s. 20 jobs on the stack's few CPUs: they queue, and all 20 waits overlap."""
    triggers = submit_many('echo "hello from job $1"; sleep 1', tmp_gate)
    before = accepted_connections(local_stack)

    async def scenario() -> list[dict]:
        waits = asyncio.ensure_future(wait_like_a_triggerer(triggers))
        await connected_session()
        tmp_gate.touch()
        return await waits

    events = asyncio.run(scenario())
    assert [e["status"] for e in events] == ["success"] * WAITS, [e["message"] for e in events]
    assert accepted_connections(local_stack) - before == 1
    out = capsys.readouterr().out
    for i in range(WAITS):
        lines = re.findall(rf"\] hello from job {i} +\[.*", out)
        assert len(lines) == 1, (i, lines)
        assert lines[0].endswith(f"trigger_id={i}"), lines[0]  # in its own task's log, not a neighbour's


@pytest.fixture
def tmp_gate(local_stack: LocalStack) -> Path:
    gate = local_stack.shared_root / "gates" / f"go-{uuid.uuid4().hex}"
    gate.parent.mkdir(parents=True, exist_ok=True)
    yield gate
    gate.touch()  # whatever happened, the jobs end now instead of holding the stack's CPUs


def sshd_descendants(listener: int) -> list[int]:
    """The processes the sshd listener forked for each connection (and what they run), by parent pid."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [listener]
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def cut_ssh(stack: LocalStack) -> None:
    """Kill sshd and every connection it serves (by the pids it started), then start it again through
    the stack's own stop and start."""
    import stack as stack_script  # include/local/stack.py

    layout = stack_script.load_layout(create=False)
    sshd = next(s for s in stack_script.SERVICES if s.name == "sshd")
    listener = stack_script.running_pid(layout, sshd)
    for pid in sshd_descendants(listener):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    stack_script.stop(layout, sshd)
    time.sleep(2)
    stack_script.start(layout, sshd)


def test_a_cut_connection_is_reopened_once_for_all_waits(local_stack, tmp_gate):
    """About 40 s. sshd and its connections are killed while 20 waits run; all of them succeed, over one
    new connection."""
    triggers = submit_many("sleep 1", tmp_gate)
    before = accepted_connections(local_stack)

    async def scenario() -> tuple[list[dict], int]:
        waits = asyncio.ensure_future(wait_like_a_triggerer(triggers))
        session = await connected_session()
        await asyncio.sleep(1)
        await asyncio.to_thread(cut_ssh, local_stack)
        tmp_gate.touch()
        return await waits, session.connections_opened

    events, opened = asyncio.run(scenario())
    assert [e["status"] for e in events] == ["success"] * WAITS, [e["message"] for e in events]
    assert opened == 2
    assert accepted_connections(local_stack) - before == 2


def test_progress_says_when_the_pending_reason_changes(slurm, capsys):
    """About 20 s. Pending for its begin time, then held, then released: the task log says each."""
    op = SlurmJobOperator(
        task_id="progress",
        program=["sleep", "3"],
        allocation={"extra_sbatch": {"begin": "now+1hour"}},
        poll_interval=0.2,
        confirm_interval=1.0,
    )
    trigger = deferred_trigger(op, make_context("progress"))

    def hold_then_release() -> None:
        watcher = SlurmHook()
        time.sleep(4)
        watcher.run(["scontrol", "hold", trigger.job_id])
        time.sleep(4)
        watcher.run(["scontrol", "update", f"JobId={trigger.job_id}", "StartTime=now"])
        watcher.run(["scontrol", "release", trigger.job_id])
        watcher.close()

    helper = threading.Thread(target=hold_then_release)
    helper.start()
    event = first_event(trigger)
    helper.join()
    assert event["status"] == "success", event
    said = re.findall(rf"Slurm job {trigger.job_id} is (pending: \w+|running)", capsys.readouterr().out)
    assert said[0] == "pending: BeginTime", said
    assert said.index("pending: BeginTime") < said.index(next(s for s in said if s.startswith("pending: JobHeld")))
    assert "running" in said, said
    assert all(a != b for a, b in itertools.pairwise(said)), said  # only changes are told


def test_progress_counts_array_elements_whenever_they_change(slurm, capsys):
    """About 20 s. Four elements, two at a time, the last one failing."""
    script = 'sleep 1; [ "$SLURM_ARRAY_TASK_ID" != 3 ] || exit 1'
    op = SlurmArrayJobOperator(
        task_id="counted",
        program=["bash", "-c", script],
        trials=[{}] * 4,
        max_parallel=2,
        min_success_ratio=0.5,
        **FAST,
    )
    trigger = deferred_trigger(op, make_context("counted"))
    event = first_event(trigger)
    assert event["status"] == "success", event
    pattern = (
        rf"Slurm job array {trigger.job_id} \(4 elements\): (\d+) pending, (\d+) running, (\d+) done, (\d+) failed"
    )
    counts = [tuple(map(int, c)) for c in re.findall(pattern, capsys.readouterr().out)]
    assert counts[-1] == (0, 0, 3, 1), counts
    assert counts[0][0] > 0, counts  # it began with elements waiting
    assert all(sum(c) == 4 for c in counts) and all(a != b for a, b in itertools.pairwise(counts))
