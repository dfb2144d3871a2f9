"""One SSH connection per head node per triggerer, shared by every pcflow wait on that node.

A triggerer runs hundreds of waits on one event loop. Each used to hold its own connection and poll
loop: N waits meant N connections (sshd's MaxStartups refuses past 10 unauthenticated ones), N stats
per poll and N squeue per confirm interval. A HeadNodeSession (one per event loop and head node: SSH
connection id, address, host key) owns one connection and one poll loop. Each tick it stats the files
of every waiter that is due in one `stat` (through a long-lived loop on the head node: statloop.py),
and once per confirm interval it asks slurmctld about all their jobs in one `squeue`. A marker that
cannot settle its job by itself (a signal, an exit code) has Slurm asked sooner, about that job alone:
with accounting in one `sacct` (slurmdbd answers; slurmctld is not asked more often, however many jobs
fail), without it in the next `squeue` brought forward. Each waiter
then reads its own log and markers and writes its own task log in its own task: the triggerer routes
a log line by the task that writes it. A dropped connection is reopened once, for all of them, with
backoff; the last waiter out closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import math
import posixpath
import random
import weakref
from collections.abc import AsyncIterator, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import asyncssh

from pcflow.slurm import queries
from pcflow.slurm.hook import SlurmError, quote_command, with_slurm_bin
from pcflow.slurm.statloop import FileStat, StatLoop

if TYPE_CHECKING:
    from pcflow.jobstates import JobInfo
    from pcflow.slurm.head_node import HeadNode
    from pcflow.slurm.watch import WatchPolicy

log = logging.getLogger(__name__)

CONNECTION_ERRORS = (OSError, asyncssh.Error, TimeoutError)
#: sshd allows 10 sessions per connection by default (MaxSessions): SFTP and the stat loop hold one each.
MAX_COMMANDS = 7  # and one for the stat loop
#: How soon Slurm is asked again when a marker cannot settle a job by itself (a signal, an exit code).
FAST_CONFIRM_S = 1.0
SLURM_QUERIES = frozenset({"squeue", "sacct", "scontrol"})
#: After an error no retry can mend (a refused host key): waiters that join later try again this much later.
REFUSED_RETRY_S = 5.0
#: Waiters woken per turn of the event loop: a thousand waking at once (each with a log line when Slurm
#: has answered) would hold the triggerer's loop, and every other trigger on it, for a second.
DELIVER_BATCH = 50
#: What squeue and scontrol say of a job id slurmctld does not know (any more): an answer, not a failure.
UNKNOWN_JOB = "Invalid job id"


class ConnectionLost(ConnectionError):
    """The shared connection was closed (by a failure elsewhere) while a waiter used it."""


class SlurmUnavailable(SlurmError):
    """A Slurm command failed (not for an unknown job id): its empty output says nothing about the jobs."""


@dataclass(frozen=True)
class View:
    """What one tick saw, handed to each waiter it served."""

    now: float
    files: dict[str, FileStat]  # watched files that exist
    #: Slurm's answer when it is newer than the waiter's last one (keyed by the ids asked), else None.
    jobs: dict[str, list[JobInfo]] | None
    generation: int  # the connection it came over

    def size(self, path: str) -> int | None:
        """The size of a watched file at this tick, None when it did not exist."""
        found = self.files.get(path)
        return found.size if found is not None else None

    def answer(self, job_id: str) -> list[JobInfo] | None:
        """Slurm's fresh word on `job_id` (an empty list: Slurm knows no such job); None when not asked."""
        return self.jobs.get(job_id) if self.jobs is not None else None


@dataclass(frozen=True)
class Trouble:
    """The connection failed; the session tries again in `delay` seconds."""

    attempt: int
    delay: float
    error: BaseException


class Waiter(Protocol):
    """What a session needs of a wait (HeadNodeTrigger is one)."""

    head_node: HeadNode
    slurm_bin: str | None
    accounting: bool
    command_timeout: float
    max_reconnect_attempts: int
    watch_policy: WatchPolicy
    log: Any
    watched_paths: Sequence[str]  # files to stat every poll

    def watched_jobs(self) -> dict[str, int | None]:
        """Job ids to ask Slurm about: an array's id maps to its size, a single job's to None."""

    async def connect(self) -> asyncssh.SSHClientConnection:
        """A new connection to the head node, its host key pinned: the session opens (and reopens) it."""


class Seat:
    """A waiter's place in a session: it waits there for views and reaches the head node through it."""

    def __init__(self, session: HeadNodeSession, waiter: Waiter) -> None:
        self.session = session
        self.waiter = waiter
        self.due_at = 0.0
        self.answered = session.answer_serial  # an answer older than the seat does not cover its jobs
        self.answers_seen = 0
        self.urgent = False
        self._next: asyncio.Future | None = None
        self._notice: Trouble | BaseException | None = None

    @property
    def waiting(self) -> bool:
        return self._next is not None and not self._next.done()

    @property
    def sftp(self) -> asyncssh.SFTPClient:
        if self.session.sftp is None:
            raise ConnectionLost("the SSH connection to the head node was closed")
        return self.session.sftp

    async def run(self, argv: list[str]) -> str:
        """A command of this waiter's own (scancel) over the shared connection; its stdout."""
        return (await self.call(argv))[1]

    async def call(self, argv: list[str]) -> tuple[int, str, str]:
        """A command of this waiter's own over the shared connection: its exit status, stdout and stderr (for a
        command whose refusal the waiter reports: `scontrol release`)."""
        result = await self.session.run(argv, slurm_bin=self.waiter.slurm_bin, timeout=self.waiter.command_timeout)
        return int(result.exit_status or 0), _text(result.stdout), _text(result.stderr)

    async def next_view(self) -> View:
        """The next tick's view. A connection failure is logged here, in the waiter's own task (so in its
        task log), and waited past; the error that ends this wait is raised."""
        while True:
            notice, self._notice = self._notice, None
            if notice is None:
                self._next = asyncio.get_running_loop().create_future()
                if self.due_at < self.session.sleeping_until:  # else the session wakes in time anyway
                    self.session.wake.set()
                notice = await self._next
            if isinstance(notice, View):
                return notice
            if isinstance(notice, BaseException):
                raise notice
            attempts = self.waiter.max_reconnect_attempts
            self.waiter.log.warning(
                "SSH to the head node failed (attempt %d/%d), reconnecting in %.1fs: %s",
                notice.attempt,
                attempts,
                notice.delay,
                notice.error,
            )

    def confirm_soon(self) -> None:
        """Ask Slurm about this waiter's jobs at the next tick (at most once a FAST_CONFIRM_S for all waiters)."""
        self.urgent = True

    def confirm_within(self, seconds: float) -> None:
        """Ask slurmctld within `seconds` at the latest (the budget cap's cadence), for all waiters at once."""
        session = self.session
        session.next_query = min(session.next_query, asyncio.get_running_loop().time() + seconds)

    def lost(self, error: BaseException, view: View) -> None:
        """This waiter's own read failed on the connection `view` came over: reconnect (once for all)."""
        self.session.lost(error, view.generation)

    def deliver(self, notice: View | Trouble | BaseException) -> None:
        """Hand the waiter a view or a failure: a view it is not waiting for is dropped (the next tick brings a
        newer one); a failure is kept until it next waits."""
        if self.waiting:
            self._next.set_result(notice)
        elif not isinstance(notice, View):
            self._notice = notice  # heard when it next waits


class HeadNodeSession:
    """One connection and one poll loop for every waiter on one head node in one event loop."""

    def __init__(self, key: tuple[str, str, str], registry: dict[tuple[str, str, str], HeadNodeSession]) -> None:
        self.key = key
        self.registry = registry
        self.seats: dict[Seat, None] = {}  # an ordered set
        self.conn: asyncssh.SSHClientConnection | None = None
        self.sftp: asyncssh.SFTPClient | None = None
        self.stat_loop: StatLoop | None = None
        self.generation = 0
        self.failures = 0
        self.retry_at = 0.0
        self.wake = asyncio.Event()
        self.commands = asyncio.Semaphore(MAX_COMMANDS)
        #: Slurm's last word on each waited job id, and the serial of the answer that brought it.
        self.answers: dict[str, tuple[int, list[JobInfo]]] = {}
        self.answer_serial = 0
        self.next_query = math.inf
        self.last_query = -math.inf
        self.last_urgent_query = -math.inf
        self.connections_opened = 0
        self.queries_sent = 0
        self.task: asyncio.Task | None = None
        self.querying: asyncio.Task | None = None
        self.next_tick = -math.inf
        self.last_files: dict[str, FileStat] = {}  # the last stat's
        self.sleeping_until = -math.inf  # while idle: when it wakes by itself

    # -- waiters come and go ------------------------------------------------------------------

    def join(self, waiter: Waiter) -> Seat:
        """A seat for a new waiter; starts the poll loop when it is the first, and has Slurm asked within the
        waiter's confirm interval."""
        loop = asyncio.get_running_loop()
        seat = Seat(self, waiter)
        self.seats[seat] = None
        self.next_query = min(self.next_query, loop.time() + waiter.watch_policy.confirm_interval)
        if self.task is None:
            # An empty context: the loop's own log lines belong to no one task's log.
            self.task = loop.create_task(
                self._run(), name=f"pcflow-head-node-{self.key[0]}", context=contextvars.Context()
            )
        self.wake.set()
        return seat

    def leave(self, seat: Seat) -> None:
        """A waiter is done, failed or was cancelled (the triggerer moved it): the last one out closes."""
        self.seats.pop(seat, None)
        if not self.seats:
            if self.registry.get(self.key) is self:
                del self.registry[self.key]
            self._close()
            self.wake.set()

    # -- the poll loop -------------------------------------------------------------------------

    async def _run(self) -> None:
        """Tick at most once a poll interval (the shortest of the waiters'), serving every waiter that
        waits and is due; a waiter still busy with its last view is served at the next tick."""
        loop = asyncio.get_running_loop()
        try:
            while self.seats:
                now = loop.time()
                due = [s for s in self.seats if s.waiting and s.due_at <= now]
                if due and now >= max(self.retry_at, self.next_tick):
                    self.next_tick = now + min(s.waiter.watch_policy.poll_interval for s in self.seats)
                    await self._tick(due, now)
                else:
                    await self._idle(now)
        finally:
            self._close()

    async def _idle(self, now: float) -> None:
        """Sleep until a waiter is due and the next tick (or the end of a backoff) has come, or until
        something changes."""
        earliest = min((s.due_at for s in self.seats if s.waiting), default=now + 60)
        until = max(earliest, self.retry_at, self.next_tick)
        self.wake.clear()
        self.sleeping_until = until
        try:
            await asyncio.wait_for(self.wake.wait(), max(0.0, until - now))
        except TimeoutError:
            pass
        finally:
            self.sleeping_until = -math.inf  # awake: no one needs to wake it

    async def _tick(self, due: list[Seat], now: float) -> None:
        """One stat for every due waiter, their views, and (in the background, so that a slow slurmctld
        delays no view) Slurm's word on every waiter's jobs when it is due."""
        generation = self.generation
        try:
            await self._connect()
            generation = self.generation
            files = await self._stat(due)
        except CONNECTION_ERRORS as exc:
            if generation == self.generation:  # else a waiter reported this connection's loss already
                self._broken(exc)
            return
        except Exception as exc:  # a refused host key, a command that cannot run: no retry will help
            self.retry_at = now + REFUSED_RETRY_S
            for seat in list(self.seats):
                seat.deliver(exc)
            return
        self.failures = 0
        due.sort(key=lambda seat: not self._news_for(seat, files))  # stable: the rest keep their order
        self.last_files = files
        for start in range(0, len(due), DELIVER_BATCH):
            if start:
                await asyncio.sleep(0)  # the waiters served so far take their turn first
            for seat in due[start : start + DELIVER_BATCH]:
                jobs = self._fresh_answers(seat)
                seat.answered, seat.due_at = self.answer_serial, now + seat.waiter.watch_policy.poll_interval
                seat.answers_seen += jobs is not None
                seat.deliver(View(now, files, jobs, self.generation))
        if self.querying is None or self.querying.done():
            query = self._query_due(now)
            if query is not None:
                self.querying = asyncio.get_running_loop().create_task(query)

    def _news_for(self, seat: Seat, files: dict[str, FileStat]) -> bool:
        """A file the seat watches changed since the last stat (a marker appeared, a log grew): such waiters
        are served first, so a job that ended waits behind no idle ones."""
        return any(files.get(path) != self.last_files.get(path) for path in seat.waiter.watched_paths)

    def _fresh_answers(self, seat: Seat) -> dict[str, list[JobInfo]] | None:
        """Slurm's word on the seat's jobs from answers it has not seen yet; None when there is none."""
        fresh = {}
        for job_id in seat.waiter.watched_jobs():
            serial, jobs = self.answers.get(job_id, (0, []))
            if serial > seat.answered:
                fresh[job_id] = jobs
        return fresh or None

    def _query_due(self, now: float) -> Coroutine[Any, Any, None] | None:
        """The question for Slurm this tick, if one is due: every job at the confirm interval; sooner, the
        jobs of urgent waiters (sacct where they keep accounting, else everything in squeue)."""
        if now >= self.next_query:
            return self._query(now, self.generation)
        urgent = [s for s in self.seats if s.urgent]
        if not urgent or now - max(self.last_query, self.last_urgent_query) < FAST_CONFIRM_S:
            return None
        if all(s.waiter.accounting for s in urgent):
            return self._query_accounting(now, self.generation, urgent)
        return self._query(now, self.generation)

    # -- the head node -------------------------------------------------------------------------

    async def _connect(self) -> None:
        if self.conn is not None:
            return
        conn = await next(iter(self.seats)).waiter.connect()
        try:
            sftp = await conn.start_sftp_client()
        except BaseException:
            conn.close()
            raise
        self.conn, self.sftp = conn, sftp
        self.connections_opened += 1

    async def run(self, argv: list[str], *, slurm_bin: str | None, timeout: float):
        """One command over the shared connection (at most MAX_COMMANDS at once)."""
        if self.conn is None:
            raise ConnectionLost("the SSH connection to the head node was closed")
        argv = with_slurm_bin(argv, slurm_bin)
        self.queries_sent += posixpath.basename(argv[0]) in SLURM_QUERIES
        async with self.commands:
            result = await self.conn.run(quote_command(argv), check=False, timeout=timeout)
        if result.exit_status is None:  # the channel closed first: whatever came is not the whole answer
            raise ConnectionLost(f"the SSH connection closed while `{argv[0]}` ran on the head node")
        return result

    @property
    def command_timeout(self) -> float:
        """The most patient waiter's: a slow but healthy head node fails no one early."""
        return max((s.waiter.command_timeout for s in self.seats), default=60.0)

    async def _stat(self, due: Iterable[Seat]) -> dict[str, FileStat]:
        """Size and inode of every file the due waiters watch, in one stat of the session's stat loop."""
        paths = list(dict.fromkeys(p for seat in due for p in seat.waiter.watched_paths))
        if not paths:
            return {}
        if self.stat_loop is None:
            self.stat_loop = await StatLoop.start(self.conn)
        return await self.stat_loop.stat(paths, self.command_timeout)

    async def _query(self, now: float, generation: int) -> None:
        """One question to Slurm for every waiter's jobs (one per Slurm installation and accounting mode);
        its answer reaches each waiter at its next view."""
        interval = min((s.waiter.watch_policy.confirm_interval for s in self.seats), default=30.0)
        self.last_query, self.next_query = now, now + interval
        for seat in self.seats:
            seat.urgent = False
        questions = [
            (slurm_bin, queries.jobs_state(singles, arrays, accounting))
            for (slurm_bin, accounting), (singles, arrays) in _jobs_by_installation(self.seats).items()
        ]
        answer = await self._ask(questions, generation, f"asking again in {interval:.0f} s")
        if answer is not None:  # every waited job: the word on jobs no longer waited is dropped
            self.answer_serial += 1
            self.answers = {job_id: (self.answer_serial, jobs) for job_id, jobs in answer.items()}

    async def _query_accounting(self, now: float, generation: int, urgent: list[Seat]) -> None:
        """The urgent waiters' jobs from accounting, in one sacct per Slurm installation: slurmdbd answers,
        slurmctld is not asked. A job sacct has no record of yet waits for the next squeue."""
        self.last_urgent_query = now
        for seat in urgent:
            seat.urgent = False
        questions = [
            (slurm_bin, queries.jobs_accounted(singles, arrays))
            for (slurm_bin, _), (singles, arrays) in _jobs_by_installation(urgent).items()
        ]
        answer = await self._ask(questions, generation, "the next squeue will tell")
        if answer:
            self.answer_serial += 1
            self.answers.update((job_id, (self.answer_serial, jobs)) for job_id, jobs in answer.items())

    async def _ask(
        self, questions: list[tuple[str | None, queries.Query]], generation: int, then: str
    ) -> dict[str, list[JobInfo]] | None:
        """Slurm's answers to `questions` (a query per Slurm installation), merged; None when there is none."""
        answer: dict[str, list[JobInfo]] = {}
        try:
            for slurm_bin, question in questions:
                answer.update(await queries.adrive(question, functools.partial(self._slurm_stdout, slurm_bin)))
        except SlurmUnavailable as exc:  # no answer is not "no such job": the waits keep their last word
            log.warning("Slurm did not answer (%s); %s", exc, then)
            return None
        except CONNECTION_ERRORS as exc:
            self.lost(exc, generation)
            return None
        except Exception:  # an answer that cannot be read: the waits keep their last word
            log.exception("Asking Slurm about the waited jobs failed; %s", then)
            return None
        return answer

    async def _slurm_stdout(self, slurm_bin: str | None, argv: list[str]) -> str:
        """A Slurm command's output; SlurmUnavailable when it failed for another reason than an unknown
        job id (slurmctld restarting, slurmdbd down), so that a failure never reads as an empty queue."""
        result = await self.run(argv, slurm_bin=slurm_bin, timeout=self.command_timeout)
        stderr = _text(result.stderr)
        if result.exit_status != 0 and UNKNOWN_JOB not in stderr:
            raise SlurmUnavailable(f"`{argv[0]}` exited with {result.exit_status}: {stderr.strip()[-300:]}")
        return _text(result.stdout)

    # -- failures ------------------------------------------------------------------------------

    def lost(self, error: BaseException, generation: int) -> None:
        """A read over connection `generation` failed: reconnect once for every waiter, unless a later
        connection already replaced it."""
        if generation == self.generation and self.conn is not None:
            self._broken(error)

    def _broken(self, error: BaseException) -> None:
        """Close, count the failure, tell every waiter: those out of attempts get the error."""
        self._close()
        self.failures += 1
        delay = min(2 ** (self.failures - 1), 30) * random.uniform(1.0, 1.5)
        self.retry_at = asyncio.get_running_loop().time() + delay
        for seat in list(self.seats):
            give_up = self.failures > seat.waiter.max_reconnect_attempts
            seat.deliver(error if give_up else Trouble(self.failures, delay, error))

    def _close(self) -> None:
        """Close the connection; every view handed out over it is now of an older generation."""
        if self.querying is not None and not self.seats:
            self.querying.cancel()
        conn, self.conn, self.sftp, self.stat_loop = self.conn, None, None, None
        if conn is not None:
            self.generation += 1
            with contextlib.suppress(Exception):
                conn.close()


def _jobs_by_installation(seats: Iterable[Seat]) -> dict[tuple[str | None, bool], tuple[list[str], dict[str, int]]]:
    """The seats' jobs by Slurm installation and accounting mode (one question each): single job ids,
    sorted, and arrays' ids with their sizes."""
    groups: dict[tuple[str | None, bool], tuple[set[str], dict[str, int]]] = {}
    for seat in seats:
        singles, arrays = groups.setdefault((seat.waiter.slurm_bin, seat.waiter.accounting), (set(), {}))
        for job_id, size in seat.waiter.watched_jobs().items():
            if size is None:
                singles.add(job_id)
            else:
                arrays[job_id] = size
    return {key: (sorted(singles), arrays) for key, (singles, arrays) in groups.items()}


def _text(out: str | bytes | None) -> str:
    return out.decode(errors="replace") if isinstance(out, bytes) else (out or "")


# -- the registry: one session per event loop and head node ---------------------------------------

_SESSIONS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, str, str], HeadNodeSession]] = (
    weakref.WeakKeyDictionary()
)


def session_key(waiter: Waiter) -> tuple[str, str, str]:
    """Same connection, address and host key: the same head node, reached the same way (whatever account
    each run's jobs run as: a command as one goes through sudo on the shared connection)."""
    head = waiter.head_node.normalized()
    return head.conn_id, head.address or "", head.host_key or ""


@contextlib.asynccontextmanager
async def joined(waiter: Waiter) -> AsyncIterator[Seat]:
    """A seat in this event loop's session for the waiter's head node, made when it is the first."""
    sessions = _SESSIONS.setdefault(asyncio.get_running_loop(), {})
    key = session_key(waiter)
    session = sessions.get(key)
    if session is None:
        session = sessions[key] = HeadNodeSession(key, sessions)
    seat = session.join(waiter)
    try:
        yield seat
    finally:
        session.leave(seat)


def current_sessions() -> list[HeadNodeSession]:
    """This event loop's sessions (for tests and benchmarks)."""
    return list(_SESSIONS.get(asyncio.get_running_loop(), {}).values())
