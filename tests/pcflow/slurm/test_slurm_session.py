"""The shared head-node session's bookkeeping, against a stand-in connection: one connection and one
stat per tick for many waiters, one reconnect for all after a failure, clean leaving on cancellation.
(test_shared_session.py runs the real thing against sshd and Slurm.)"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from pcflow.jobstates import SQUEUE_FORMAT, JobState
from pcflow.slurm import queries
from pcflow.slurm.head_node import HeadNode
from pcflow.slurm.session import Seat, current_sessions, joined
from pcflow.slurm.statloop import TERMINATOR, FileStat, parse_stats
from pcflow.slurm.watch import WatchPolicy


@dataclass
class Result:
    exit_status: int | None
    stdout: str = ""
    stderr: str = ""


@dataclass
class Server:
    """What the stand-in head node was asked, and a failure to serve once."""

    commands: list[str] = field(default_factory=list)
    connections: list[Connection] = field(default_factory=list)
    fail_next: bool = False
    replies: dict[str, str] = field(default_factory=dict)  # a command's first word -> its stdout
    sizes: dict[str, int] = field(default_factory=dict)  # a file's size when not 7 bytes

    def fail_if_asked(self) -> None:
        if self.fail_next:
            self.fail_next = False
            raise ConnectionResetError("cut")


@dataclass
class Connection:
    server: Server
    closed: bool = False

    async def start_sftp_client(self) -> object:
        return object()

    async def run(self, command: str, check: bool = False, timeout: float = 0) -> Result:
        await asyncio.sleep(0)
        self.server.commands.append(command)
        self.server.fail_if_asked()
        return Result(0, self.server.replies.get(command.split(" ", 1)[0], ""))

    async def create_process(self, command: str, **_: object) -> StatProcess:
        return StatProcess(self.server)

    def close(self) -> None:
        self.closed = True


class StatProcess:
    """The stat loop's far end: every path exists, 7 bytes, inode 1."""

    def __init__(self, server: Server) -> None:
        self.server, self.answers = server, asyncio.Queue()
        self.stdin, self.stdout = self, self

    def write(self, data: bytes) -> None:
        paths = [p for p in data.split(b"\n", 1)[1].decode().split("\0") if p]
        self.server.commands.append(f"stat {len(paths)} paths")
        sizes = self.server.sizes
        self.answers.put_nowait("".join(f"{sizes.get(p, 7)} 1 {p}\0" for p in paths).encode() + TERMINATOR)

    async def readuntil(self, separator: bytes) -> bytes:
        self.server.fail_if_asked()
        return await self.answers.get()

    def close(self) -> None:
        pass


@dataclass(eq=False)
class Waiter:
    server: Server
    name: str
    head_node: HeadNode = field(default_factory=lambda: HeadNode("slurm_default", None, "ssh-ed25519 AAAA"))
    slurm_bin: str | None = None
    accounting: bool = False
    command_timeout: float = 5.0
    max_reconnect_attempts: int = 3
    watch_policy: WatchPolicy = field(default_factory=lambda: WatchPolicy(poll_interval=0.01, confirm_interval=0.05))
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("test.waiter"))

    @property
    def watched_paths(self) -> list[str]:
        return [f"/runs/{self.name}/job.log", f"/runs/{self.name}/exit.json"]

    def watched_jobs(self) -> dict[str, int | None]:
        return {self.name: None}

    async def connect(self) -> Connection:
        conn = Connection(self.server)
        self.server.connections.append(conn)
        return conn


async def views(waiter: Waiter, count: int) -> list:
    async with joined(waiter) as seat:
        return [await seat.next_view() for _ in range(count)]


def test_many_waiters_one_connection_one_stat_per_tick_one_squeue_per_interval():
    server = Server()

    async def scenario():
        waiters = [Waiter(server, str(i)) for i in range(10)]
        seen = await asyncio.gather(*(views(w, 8) for w in waiters))
        return seen, current_sessions()

    seen, left = asyncio.run(scenario())
    assert len(server.connections) == 1 and server.connections[0].closed and left == []
    stats = [c for c in server.commands if c.startswith("stat ")]
    squeues = [c for c in server.commands if c.startswith("squeue")]
    assert len(stats) <= 10  # about one per tick, whatever the number of waiters (8 views each)
    assert 1 <= len(squeues) <= len(stats) and all("-j 0,1,2,3,4,5,6,7,8,9 " in c for c in squeues)
    assert seen[3][-1].files["/runs/3/exit.json"] == FileStat(7, 1)


def test_a_failure_reconnects_once_for_all_and_a_cancelled_waiter_leaves():
    server = Server()

    async def scenario():
        waiters = [Waiter(server, str(i)) for i in range(5)]
        stuck = asyncio.ensure_future(views(Waiter(server, "moved"), 1000))  # the triggerer moves it away
        first = asyncio.gather(*(views(w, 2) for w in waiters))
        await first
        server.fail_next = True
        again = await asyncio.gather(*(views(w, 2) for w in waiters))
        stuck.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stuck
        await asyncio.sleep(0.05)
        return again, current_sessions()

    again, left = asyncio.run(scenario())
    assert [len(v) for v in again] == [2] * 5
    assert len(server.connections) == 2 and all(c.closed for c in server.connections)
    assert left == []


def test_out_of_attempts_the_error_reaches_the_waiters():
    server = Server()

    async def scenario():
        waiter = Waiter(server, "0", max_reconnect_attempts=0)
        server.fail_next = True
        return await views(waiter, 1)

    with pytest.raises(ConnectionResetError):
        asyncio.run(scenario())


def test_jobs_state_asks_squeue_once_then_sacct_for_what_it_forgot():
    asked = []
    squeue_lines = "5|RUNNING|None|0|a|0:05|n1|root|\n7_0|COMPLETED|None|0|b|0:01|n1|root|\n"
    sacct_lines = "6|a|COMPLETED|0:0|3|n1|None|root\n7_[1-2]|b|PENDING|0:0|0|None assigned|None|root\n"

    def run(argv: list[str]) -> str:
        asked.append(argv)
        return {"squeue": squeue_lines, "sacct": sacct_lines}.get(argv[0], "")

    found = queries.drive(queries.jobs_state(["5", "6", "8"], {"7": 3}, accounting=True), run)
    assert asked[0] == ["squeue", "-h", "-r", "-t", "all", "-j", "5,6,8,7", "-O", SQUEUE_FORMAT]
    assert asked[1][:7] == ["sacct", "-n", "-P", "-X", "-D", "-j", "6,8,7"]
    assert len(asked) == 2  # 8, which neither knows, is not asked about again (scontrol reads squeue's table)
    assert [j.state.value for j in found["5"]] == ["RUNNING"]
    assert [j.source for j in found["6"]] == ["sacct"] and found["8"] == []
    assert [j.job_id for j in found["7"]] == ["7_0", "7_1", "7_2"] and found["7"][0].source == "squeue"


def test_stat_records_keep_paths_with_spaces():
    assert parse_stats("12 34 /a b/c\0junk\0 0 /x\0") == {"/a b/c": FileStat(12, 34)}


#: Slurm is asked once a minute unless a waiter asks sooner.
PATIENT = WatchPolicy(poll_interval=0.01, confirm_interval=60)


async def views_after(waiter: Waiter, ask: Callable[[Seat], None], count: int) -> list:
    """`count` views after the first one, once `ask` has had its say on the seat."""
    async with joined(waiter) as seat:
        await seat.next_view()
        assert [c for c in waiter.server.commands if not c.startswith("stat ")] == []  # not asked yet
        ask(seat)
        return [await seat.next_view() for _ in range(count)]


def test_a_waiter_can_have_slurm_asked_sooner_for_everyone():
    """The budget cap's cadence: one waiter's deadline brings the session's one squeue forward."""
    server = Server()
    views = asyncio.run(views_after(Waiter(server, "0", watch_policy=PATIENT), lambda s: s.confirm_within(0.02), 10))
    assert len([c for c in server.commands if c.startswith("squeue")]) == 1
    assert any(v.answer("0") is not None for v in views)


def test_an_urgent_wait_with_accounting_asks_sacct_about_its_job_alone():
    """A marker that cannot settle its job has Slurm asked soon: slurmdbd (sacct) about that job only, so
    slurmctld's one squeue per confirm interval keeps its cadence however many jobs fail."""
    server = Server(replies={"sacct": "5|j|FAILED|1:0|3|node1||root\n"})

    async def scenario():
        failed = Waiter(server, "5", accounting=True, watch_policy=PATIENT)
        running = Waiter(server, "6", accounting=True, watch_policy=PATIENT)
        async with joined(failed) as seat, joined(running) as other:
            await asyncio.gather(seat.next_view(), other.next_view())
            seat.confirm_soon()
            both = [await asyncio.gather(seat.next_view(), other.next_view()) for _ in range(30)]
        return both

    both = asyncio.run(scenario())
    asked = [c.split(" ", 1)[0] for c in server.commands if not c.startswith("stat ")]
    assert asked == ["sacct"] and " -j 5 " in next(c for c in server.commands if c.startswith("sacct"))
    answers = [mine.answer("5") for mine, _ in both if mine.answer("5") is not None]
    assert len(answers) == 1 and answers[0][0].state is JobState.FAILED and answers[0][0].exit_code == 1
    assert all(theirs.answer("6") is None for _, theirs in both)


def test_an_urgent_wait_without_accounting_brings_the_squeue_forward():
    server = Server()
    views = asyncio.run(views_after(Waiter(server, "5", watch_policy=PATIENT), lambda s: s.confirm_soon(), 30))
    asked = [c.split(" ", 1)[0] for c in server.commands if not c.startswith("stat ")]
    assert asked == ["squeue"] and any(v.answer("5") == [] for v in views)


def test_a_waiter_whose_files_changed_is_served_first():
    """A job that just ended (its marker appeared) does not wait behind a thousand idle waits' views.
    A poll interval of half a second lets every waiter take its first view before the second tick, also
    on a loaded machine (with 10 ms, a second tick could stat before the marker appeared)."""
    server = Server()
    slow = WatchPolicy(poll_interval=0.5, confirm_interval=1.0)
    order: list[str] = []

    async def wait(waiter: Waiter, rounds: int) -> None:
        async with joined(waiter) as seat:
            for _ in range(rounds):
                await seat.next_view()
                order.append(waiter.name)
                if len(order) == 150:  # every waiter has its first view: the last one's job ends
                    server.sizes["/runs/149/exit.json"] = 120

    async def scenario():
        await asyncio.gather(*(wait(Waiter(server, str(i), watch_policy=slow), 2) for i in range(150)))

    asyncio.run(scenario())
    assert order[:150].index("149") >= 100 and order[150:].index("149") < 50


def test_a_thousand_waits_share_one_connection_one_stat_a_tick_and_one_sacct_for_fifty_failures():
    """Issue 28's scale (1,000 waits on one head node), in counts: one connection, a stat per tick for all of
    them, no squeue before the confirm interval, and the markers that cannot settle their jobs (50) asked about
    together in one sacct (slurmdbd), not a question each and not a squeue brought forward."""
    server = Server()

    async def one(waiter: Waiter) -> None:
        async with joined(waiter) as seat:
            await seat.next_view()
            if int(waiter.name) % 20 == 19:
                seat.confirm_soon()
            for _ in range(3):
                await seat.next_view()

    async def scenario() -> None:
        waiters = [Waiter(server, str(i), accounting=True, watch_policy=PATIENT) for i in range(1000)]
        await asyncio.gather(*(one(w) for w in waiters))

    asyncio.run(scenario())
    assert len(server.connections) == 1
    stats = [c for c in server.commands if c.startswith("stat ")]
    # One per tick for every due waiter's two files: 4,000 views in a few dozen stats at most (a waiter still busy
    # with its last view is served at the next tick, so a loaded machine makes a few more), never one per wait.
    assert 4 <= len(stats) <= 40 and stats[0] == "stat 2000 paths"
    asked = [c for c in server.commands if not c.startswith("stat ")]
    assert [c.split(" ", 1)[0] for c in asked] == ["sacct"]
    failed = set(asked[0].split(" -j ", 1)[1].split(" ", 1)[0].split(","))
    # Those that had asked by the time it was due (the rest wait FAST_CONFIRM_S for the next): never a running one.
    assert failed <= {str(i) for i in range(19, 1000, 20)} and len(failed) > 25


def test_a_thousand_jobs_slurmctld_forgot_cost_one_squeue_not_a_scontrol_each():
    """Waits back after slurmctld's MinJobAge, without accounting: squeue lists none of their jobs, and the
    question stays one slurmctld RPC (scontrol reads the same table: it was asked once per job, 1,000 RPCs)."""
    asked = []

    def run(argv: list[str]) -> str:
        asked.append(argv[0])
        return ""

    ids = [str(i) for i in range(1000, 2000)]
    found = queries.drive(queries.jobs_state(ids, {}, accounting=False), run)
    assert asked == ["squeue"] and found == {job_id: [] for job_id in ids}
