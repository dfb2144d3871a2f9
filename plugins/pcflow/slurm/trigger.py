"""Wait for Slurm jobs in the triggerer: the log streamed, no worker slot held, and every wait on one
head node sharing one SSH connection (pcflow.slurm.session).

Every `poll_interval` the session stats the waited jobs' files in one `stat` (the head node does a
stat; slurmctld does nothing): each job's log, whose new lines go to its task log, and the exit marker
the batch script's wrapper writes. A marker of a clean end (exit code 0, or pcflow's early stop)
settles the job at once; any other end is Slurm's to explain, so Slurm is asked at the next tick
(accounting, where the cluster keeps it: slurmctld's cadence stays one squeue per interval).
Otherwise slurmctld is asked once every `confirm_interval`, for all the session's jobs in one squeue,
which also tells each task's log when its job's pending reason changes.

The job writes these files, so every read is bounded: a marker is read only when small, the log at
most LOG_POLL_BYTES and LOG_POLL_LINES a poll (a log running further ahead is skipped, with a note),
and a line without end is cut. One triggerer runs many waits on one event loop: none may stall it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import posixpath
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncssh
from airflow.triggers.base import BaseTrigger, TriggerEvent

from pcflow import capacity
from pcflow.budget import CostMeter
from pcflow.jobstates import JobInfo, JobState
from pcflow.readings.jsonlines import from_line_start
from pcflow.readings.stopping import (
    BUDGET_FILE,
    EARLY_STOP_FILE,
    METRICS_TAIL_BYTES,
    Decision,
    decide_from_lines,
    stop_record,
)
from pcflow.slurm import jobfiles, kills, session
from pcflow.slurm.head_node import HeadNode, head_node_argument
from pcflow.slurm.hook import (
    SMALL_FILE_BYTES,
    HostKeyMismatch,
    as_job_user,
    connect_async,
    json_object,
    quote_command,
    with_slurm_bin,
)
from pcflow.slurm.outcomes import Outcome
from pcflow.slurm.progress import ArrayProgress, JobProgress
from pcflow.slurm.session import CONNECTION_ERRORS, Seat, View
from pcflow.slurm.statloop import FileStat
from pcflow.slurm.watch import (
    ArrayWatch,
    JobWatch,
    LogCursor,
    Verdict,
    WatchPolicy,
    ends_cleanly,
    marker_job_info,
    marker_matches,
)

LOG_CHUNK_BYTES = 256 * 1024
#: What one poll takes from the job log at most; each line is a logging call on the event loop.
LOG_POLL_BYTES = 4 * 1024 * 1024
LOG_POLL_LINES = 2000
LOG_BATCH_LINES = 100  # logged between two turns of the event loop
#: A log further ahead than this (a job writing faster than the task log can follow) is skipped to
#: its end; the task log says how much, and the whole log stays on the cluster.
LOG_MAX_BEHIND = 64 * 1024 * 1024
#: When the job is over: this many more polls' worth of log, then only its last bytes.
LOG_FINAL_POLLS = 4
LOG_TAIL_BYTES = 16 * 1024
#: What one poll takes of an array's `done` file (a line per ended element, `<index> <exit code>`).
DONE_POLL_BYTES = 64 * 1024


def sftp_status(attrs: asyncssh.SFTPAttrs) -> jobfiles.Status:
    """What `jobfiles` compares of a status asyncssh gives (SFTP v3: `permissions` holds st_mode)."""
    return jobfiles.Status(attrs.permissions or 0, attrs.uid, attrs.gid)


@contextlib.asynccontextmanager
async def open_job_file(sftp: asyncssh.SFTPClient, path: str) -> AsyncIterator[tuple[Any, int]]:
    """A file in a job's directory opened for reading, and its size, only if its name is a regular file
    and the file opened is the one the name showed: SFTP cannot refuse to follow a link, so a link the
    job made (to a file only the SSH user may read) is refused before and after the open
    (`pcflow.slurm.jobfiles`)."""
    named = sftp_status(await sftp.lstat(path))
    jobfiles.check_named(path, named)
    async with sftp.open(path, "rb") as fh:
        opened = await fh.stat()
        jobfiles.check_opened(path, named, sftp_status(opened))
        yield fh, opened.size or 0


class HeadNodeTrigger(BaseTrigger):
    """A wait on a head node, in that node's shared session (reconnected with backoff for all its
    waiters); subclasses say what to watch and decide each poll."""

    def __init__(
        self,
        *,
        job_id: str,
        run_dir: str,
        head_node: HeadNode | dict[str, Any] | str | None = None,
        ssh_conn_id: str | None = None,
        remote_host: str | None = None,
        host_key: str | None = None,
        accounting: bool = False,
        slurm_bin: str | None = None,
        policy: dict[str, Any] | None = None,
        max_reconnect_attempts: int = 8,
        command_timeout: float = 60.0,
        early_stopping: dict[str, Any] | None = None,
        budget: dict[str, Any] | None = None,
        secret_env: dict[str, dict[str, str]] | None = None,
    ) -> None:
        super().__init__()
        # ssh_conn_id, remote_host, host_key: how a trigger stored before HeadNode (pcflow 0.1) names it.
        self.head_node = HeadNode.of(head_node_argument(head_node, ssh_conn_id, remote_host, host_key))
        self.job_id = job_id
        self.run_dir = run_dir
        self.accounting = accounting
        self.slurm_bin = slurm_bin
        self.policy = dict(policy or {})
        self.max_reconnect_attempts = max_reconnect_attempts
        self.command_timeout = command_timeout
        self.early_stopping = early_stopping
        self.stopped_early: set[str] = set()
        self.budget = budget
        self.budget_spent = False
        #: The job's secrets by reference (never their values: these kwargs are stored and shown):
        #: resolved in the triggerer so that the log lines it streams hide them.
        self.secret_env = secret_env
        #: Slurm answers this wait was given (one squeue answers for every wait on the head node).
        self.queries_sent = 0

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{type(self).__module__}.{type(self).__qualname__}", self.kwargs()

    def kwargs(self) -> dict[str, Any]:
        """The constructor's arguments, JSON only: what Airflow stores to rebuild the trigger (so never a
        secret's value). Subclasses add their own."""
        return {
            "head_node": self.head_node.as_dict(),
            "job_id": self.job_id,
            "run_dir": self.run_dir,
            "accounting": self.accounting,
            "slurm_bin": self.slurm_bin,
            "policy": self.policy,
            "max_reconnect_attempts": self.max_reconnect_attempts,
            "command_timeout": self.command_timeout,
            "early_stopping": self.early_stopping,
            "budget": self.budget,
            "secret_env": self.secret_env,
        }

    @functools.cached_property
    def watch_policy(self) -> WatchPolicy:
        return WatchPolicy(**self.policy)

    #: How many jobs this wait watches (an array: its elements), for the budget's cadence.
    jobs_at_once = 1
    #: How many of them may run at once (an array's `%` throttle); None: all of them.
    running_at_most: int | None = None

    @functools.cached_property
    def meter(self) -> CostMeter | None:
        """The run's cost so far (the first task's prices and budget; `budget["run_started"]`: epoch s)."""
        if not self.budget:
            return None
        every = float(self.budget.get("report_every_s") or 300)
        return CostMeter(
            self.budget, float(self.budget["run_started"]), self.jobs_at_once, every, at_most=self.running_at_most
        )

    #: Files the session stats for this wait every poll.
    watched_paths: Sequence[str] = ()

    def watched_jobs(self) -> dict[str, int | None]:
        """Jobs the session asks Slurm about every confirm interval: id -> array size (None: one job)."""
        return {}

    # -- remote access -------------------------------------------------------------------------

    async def connect(self) -> asyncssh.SSHClientConnection:
        """A new connection to the head node, its host key pinned: the session opens the shared one through
        its first waiter, `on_kill` one of its own."""
        return await connect_async(self.head_node)

    async def run_command(self, conn: asyncssh.SSHClientConnection, argv: list[str]) -> str:
        """A command's stdout over `conn`, `slurm_bin` applied, never failing on its exit code (scancel of a job
        already gone)."""
        argv = with_slurm_bin(argv, self.slurm_bin)
        result = await conn.run(quote_command(argv), check=False, timeout=self.command_timeout)
        out = result.stdout or ""
        return out.decode(errors="replace") if isinstance(out, bytes) else out

    @staticmethod
    async def read_bytes(sftp: asyncssh.SFTPClient, path: str, max_bytes: int = SMALL_FILE_BYTES) -> bytes | None:
        """A small file's bytes; None when it is absent, not a regular file (a link a job made is never
        followed), or larger than `max_bytes` (not what pcflow wrote)."""
        try:
            async with open_job_file(sftp, path) as (fh, _):
                data = await fh.read(max_bytes + 1)
        except asyncssh.SFTPNoSuchFile:
            return None
        except jobfiles.NotAJobFile as exc:
            jobfiles.refused(exc)
            return None
        return data if len(data) <= max_bytes else None

    @staticmethod
    async def read_tail(sftp: asyncssh.SFTPClient, path: str, max_bytes: int) -> tuple[bytes, int] | None:
        """The last `max_bytes` of a file and the offset they start at; None when it is absent or not a
        regular file (a link a job made is never followed)."""
        try:
            async with open_job_file(sftp, path) as (fh, size):
                offset = max(0, size - max_bytes)
                return await fh.read(size - offset, offset), offset
        except asyncssh.SFTPNoSuchFile:
            return None
        except jobfiles.NotAJobFile as exc:
            jobfiles.refused(exc)
            return None

    @classmethod
    async def read_json(cls, sftp: asyncssh.SFTPClient, path: str) -> dict | None:
        """A small JSON object (a marker); None for anything else."""
        return json_object(await cls.read_bytes(sftp, path))

    async def read_marker(self, sftp: asyncssh.SFTPClient, path: str, seen: FileStat | None) -> dict | None:
        """The marker the stat saw (None when absent, or too large to be one)."""
        if seen is None or seen.size > SMALL_FILE_BYTES:
            return None
        return await self.read_json(sftp, path)

    @staticmethod
    async def write_decision(sftp: asyncssh.SFTPClient, path: str, data: bytes) -> None:
        """Write one of pcflow's decisions into a job's directory through a new file and a rename: the job
        may write there too, and a name it planted (a link to one of the SSH user's files) is replaced,
        never followed (the directory is sticky: the job cannot replace the file pcflow wrote)."""
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        async with sftp.open(tmp, "xb", asyncssh.SFTPAttrs(permissions=0o640)) as fh:
            await fh.write(data)
        await sftp.posix_rename(tmp, path)

    async def stop_early_if_due(self, seat: Seat, job_id: str, trial_dir: str) -> None:
        """Apply the run's early-stopping rule to a running trial (the wait already looks at it, so no
        other task has to: nothing waits for a job that was never submitted)."""
        if not self.early_stopping or job_id in self.stopped_early:
            return
        decision = await self.evaluate_trial(seat.sftp, trial_dir)
        if decision.stop:
            await self.stop_trial(seat, job_id=job_id, trial_dir=trial_dir, decision=decision)
            self.stopped_early.add(job_id)
            self.log.info(
                "Stopping Slurm job %s early: %s after %d evaluations", job_id, decision.reason, decision.evaluations
            )

    async def evaluate_trial(self, sftp: asyncssh.SFTPClient, trial_dir: str) -> Decision:
        """The rule applied to the last METRICS_TAIL_BYTES of the trial's metrics, parsed in a thread: the
        triggerer's event loop serves every other wait meanwhile."""
        tail = await self.read_tail(sftp, posixpath.join(trial_dir, "metrics.jsonl"), METRICS_TAIL_BYTES)
        data, offset = tail or (b"", 0)
        return await asyncio.to_thread(decide_from_lines, from_line_start(data, offset), self.early_stopping or {})

    async def stop_trial(self, seat: Seat, *, job_id: str, trial_dir: str, decision: Decision) -> None:
        """Record the decision, then scancel: the batch wrapper reads the record on SIGTERM and marks the
        trial stopped early instead of failed."""
        record = stop_record(job_id=job_id, trial_dir=trial_dir, rule=self.early_stopping or {}, decision=decision)
        await self.write_decision(seat.sftp, posixpath.join(trial_dir, EARLY_STOP_FILE), record)
        await seat.run(as_job_user(["scancel", job_id], self.head_node.job_user))

    async def meter_cost(self, seat: Seat, infos: list[JobInfo] | None) -> None:
        """Log the cost so far at its cadence (`infos`: Slurm's fresh answer, if this view has one); at the
        budget, record it and cancel the job, once; have Slurm asked before the budget could be reached."""
        meter = self.meter
        if meter is None or self.budget_spent:
            return
        wall = time.time()
        if infos is not None:
            meter.observe(infos, wall)
        self.note(meter.report(wall))
        if meter.exhausted(wall):
            await self.stop_at_budget(seat, meter.record(self.job_id, wall))
            return
        ask = meter.ask_within(wall)
        if ask is not None:
            seat.confirm_within(ask)

    async def stop_at_budget(self, seat: Seat, record: dict[str, Any]) -> None:
        """Write budget_exhausted.json into the run directory, then scancel the job (an array: all of it):
        the batch wrapper reads the record on SIGTERM and marks the attempt ended at its budget."""
        from pcflow.budget import usd

        # json.dumps' default spacing: the batch wrapper greps for `"job_id": "<its id>"` on SIGTERM.
        await self.write_decision(seat.sftp, posixpath.join(self.run_dir, BUDGET_FILE), json.dumps(record).encode())
        await seat.run(as_job_user(["scancel", self.job_id], self.head_node.job_user))
        self.budget_spent = True
        self.log.warning(
            "The run's cost so far, %s, reached its budget of %s: cancelled Slurm job %s",
            usd(record["cost_usd"]),
            usd(record["budget_usd"]),
            self.job_id,
        )

    def after_budget(self, verdict: Any) -> Any:
        """A job cancelled at its budget before its wrapper could say so (still pending, an array's
        elements not started) ends `budget_exhausted` all the same."""
        if not self.budget_spent or verdict.outcome.ok:
            return verdict
        message = f"{verdict.message} (pcflow cancelled Slurm job {self.job_id} when the run reached its budget)"
        return dataclasses.replace(verdict, outcome=Outcome.BUDGET_EXHAUSTED, message=message, retryable=True)

    @staticmethod
    async def size_of(sftp: asyncssh.SFTPClient, path: str) -> int | None:
        """A remote file's size, None when it does not exist (yet)."""
        try:
            return (await sftp.stat(path)).size or 0
        except asyncssh.SFTPNoSuchFile:
            return None

    @staticmethod
    async def close(conn: asyncssh.SSHClientConnection | None) -> None:
        """Close a connection of this wait's own; errors on the way out are ignored (nothing is left to release)."""
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
                await conn.wait_closed()

    def note(self, line: str | None) -> None:
        """A progress line (pending reason, array counts) into the task log."""
        if line:
            self.log.info("%s", line)

    # -- the wait ------------------------------------------------------------------------------

    async def poll(self, seat: Seat, view: View) -> dict | None:
        """Look once at what the session saw; return the event payload when the wait is over."""
        raise NotImplementedError

    def error_payload(self, exc: Exception) -> dict[str, Any]:
        """`retryable` False (a host key mismatch): the task fails without retries."""
        retryable = not isinstance(exc, HostKeyMismatch)
        then = "a retry of the task re-attaches to it." if retryable else "the task is not retried."
        return {
            "status": "error",
            "outcome": "error",
            "retryable": retryable,
            "job_id": self.job_id,
            "run_dir": self.run_dir,
            "message": f"Lost track of Slurm job {self.job_id}: {str(exc).rstrip('.')}. The job itself was not "
            f"touched; {then}",
        }

    async def run(self) -> AsyncIterator[TriggerEvent]:
        kills.ask_early(self.task_instance)  # so that on_kill's question is answered in time
        try:
            payload = await self.wait()
        except Exception as exc:
            self.log.exception("Waiting for Slurm job %s failed", self.job_id)
            payload = self.error_payload(exc)
        yield TriggerEvent(payload)

    async def wait(self) -> dict[str, Any]:
        """Poll at each view the head node's session hands over until the wait is over. Cancelled (the
        triggerer moved this trigger elsewhere, or the task was killed), it leaves the session cleanly."""
        async with session.joined(self) as seat:
            while True:
                view = await seat.next_view()
                self.queries_sent = seat.answers_seen
                try:
                    payload = await self.poll(seat, view)
                except CONNECTION_ERRORS as exc:
                    seat.lost(exc, view)
                    continue
                if payload is not None:
                    return {**payload, "slurm_queries": self.queries_sent}

    async def on_kill(self) -> None:
        """Airflow cancelled this wait as a user's action: when a person stopped the deferred task (marked it
        failed or succeeded, cleared it), the job is cancelled so it stops using (and billing) nodes; when the
        trigger moved to another triggerer (this one's heartbeat was late), the task is still deferred and
        the job keeps running for the other triggerer's wait (pcflow.slurm.kills)."""
        verdict = await kills.trigger_kill_verdict(self.task_instance)
        if not verdict.by_person:
            self.log.warning(
                "Slurm job %s keeps running: Airflow cancelled this wait, but not for a person (%s): the wait "
                "goes on in another triggerer. To stop the job, mark the task failed or clear it.",
                self.job_id,
                verdict.said,
            )
            return
        conn = await self.connect()
        try:
            await self.run_command(conn, as_job_user(["scancel", self.job_id], self.head_node.job_user))
            self.log.info(
                "Cancelled Slurm job %s: a person stopped this task (Airflow has it as %s now)",
                self.job_id,
                verdict.said,
            )
        finally:
            await self.close(conn)


async def secret_values(references: dict[str, dict[str, str]], log: Any) -> tuple[str, ...]:
    """The values of the job's secrets, read as the train task read them (an Airflow Variable or
    Connection: the triggerer asks its supervisor); one that cannot be read is not hidden, and said."""
    from asgiref.sync import sync_to_async

    from pcflow.runspec import SecretReference

    values = []
    for name, reference in references.items():
        try:
            values.append(await sync_to_async(SecretReference.model_validate(reference).resolve)(name))
        except Exception as exc:  # the job runs all the same; its log may then show this one
            log.warning("training.env.%s cannot be read in the triggerer (%s): its log lines do not hide it", name, exc)
    return tuple(values)


class SlurmJobTrigger(HeadNodeTrigger):
    """Fires once, when one job is over for good (requeues included) or the wait gives up."""

    def __init__(self, *, log_offset: int = 0, capacity: list[dict[str, Any]] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.log_offset = log_offset
        #: The run's capacity options in order (pcflow.capacity): a pending job whose partition's nodes are
        #: down for insufficient capacity is moved to the next one's partition; the moves made, for the result.
        self.capacity = capacity
        self.moves: list[dict[str, Any]] = []
        #: A release of the job's hold Slurm refused was logged (once: it is tried again at each answer).
        self.release_refused = False
        self.watch = JobWatch(self.job_id, self.watch_policy)
        self.cursor = LogCursor(offset=log_offset)
        self.progress = JobProgress()
        self.marker: dict | None = None
        self.marker_seen: FileStat | None = None
        self.info: JobInfo | None = None  # what Slurm said last

    def kwargs(self) -> dict[str, Any]:
        return {**super().kwargs(), "log_offset": self.log_offset, "capacity": self.capacity}

    async def wait(self) -> dict[str, Any]:
        self.cursor.hidden = await secret_values(self.secret_env or {}, self.log)
        return await super().wait()

    @property
    def log_path(self) -> str:
        return posixpath.join(self.run_dir, "job.log")

    @property
    def marker_path(self) -> str:
        return posixpath.join(self.run_dir, "exit.json")

    @functools.cached_property
    def watched_paths(self) -> tuple[str, ...]:
        """The marker first: stat'd in this order, a marker seen means the log's size counts every line
        the job wrote before it (the wrapper writes its last line, then the marker)."""
        return self.marker_path, self.log_path

    def watched_jobs(self) -> dict[str, int | None]:
        return {self.job_id: None}

    async def stream_log(self, sftp: asyncssh.SFTPClient, size: int | None) -> bool:
        """New lines of the job log (now `size` bytes; None: absent) into the task log, within one
        poll's budget; True when more is left."""
        if size is None:
            return False
        if size < self.cursor.offset:
            self.log.warning(
                "Job log %s shrank (%d < %d bytes); reading it again", self.log_path, size, self.cursor.offset
            )
            self.cursor.offset = 0
        if size - self.cursor.offset > LOG_MAX_BEHIND:
            self.skip_log(size - LOG_POLL_BYTES)
        if size == self.cursor.offset:
            return False
        bytes_left, lines_left = LOG_POLL_BYTES, LOG_POLL_LINES
        async with sftp.open(self.log_path, "rb") as fh:
            while size > self.cursor.offset and bytes_left > 0 and lines_left > 0:
                start = self.cursor.offset
                chunk = await fh.read(min(size - start, LOG_CHUNK_BYTES, bytes_left), start)
                if not chunk:
                    return False
                lines = self.cursor.feed(chunk, max_lines=lines_left)
                await self.emit(lines)
                bytes_left -= self.cursor.offset - start
                lines_left -= len(lines)
        return size > self.cursor.offset

    def skip_log(self, offset: int) -> None:
        """Jump the log cursor to `offset`, saying in the task log how much was skipped and where the whole log is."""
        skipped = self.cursor.skip_to(offset)
        self.log.warning(
            "Skipped %d bytes of the job log: it grows faster than the task log can follow. All of "
            "it is in %s on the cluster.",
            skipped,
            self.log_path,
        )

    async def finish_log(self, sftp: asyncssh.SFTPClient, size: int | None) -> None:
        """The job is over: what is left of its log (`size`: as last stat'd, after the job's end), or,
        when that is much, its last lines."""
        for _ in range(LOG_FINAL_POLLS):
            if not await self.stream_log(sftp, size):
                break
            size = await self.size_of(sftp, self.log_path)
        else:
            tail = await self.read_tail(sftp, self.log_path, LOG_TAIL_BYTES)
            if tail is not None:
                data, offset = tail
                if offset > self.cursor.offset:
                    self.skip_log(offset)
                await self.emit(self.cursor.feed(data[self.cursor.offset - offset :])[-LOG_POLL_LINES:])
        await self.emit(self.cursor.flush())

    async def emit(self, lines: list[str]) -> None:
        """Log lines into the task log, letting the event loop serve other waits between batches."""
        for start in range(0, len(lines), LOG_BATCH_LINES):
            for line in lines[start : start + LOG_BATCH_LINES]:
                self.log.info("%s", line)
            await asyncio.sleep(0)

    async def poll(self, seat: Seat, view: View) -> dict | None:
        seen = view.files.get(self.marker_path)
        marker_changed = seen != self.marker_seen
        streaming = self.stream_log(seat.sftp, view.size(self.log_path))
        if marker_changed:  # read along with the log: the end of a job costs one round trip's depth less
            _, marker = await asyncio.gather(streaming, self.read_marker(seat.sftp, self.marker_path, seen))
            self.marker_seen, self.marker = seen, marker
        else:
            await streaming
        answer = view.answer(self.job_id)
        if answer is None:  # between questions to slurmctld: only a marker of a clean end decides
            verdict = self.watch.settle(self.marker, self.info)
            if verdict is None and marker_changed and self.marker_is_ours():
                seat.confirm_soon()  # ended otherwise (a signal, an exit code): Slurm says why
        else:
            self.info = answer[0] if answer else None
            self.note(self.progress.note(self.info))
            verdict = self.watch.assess(self.info, self.marker, view.now)
            if verdict is None and self.info is not None and self.info.state is JobState.RUNNING:
                await self.stop_early_if_due(seat, self.job_id, self.run_dir)
            if verdict is None and self.watch.release_due(self.info):
                await self.release_held(seat, self.info)
            fallback = len(self.capacity or ()) > 1  # an option to move to: else no question is asked
            if verdict is None and fallback and self.info is not None and self.info.state is JobState.PENDING:
                await self.fall_back_if_short(seat)
            if verdict is None and self.info is not None and marker_matches(self.marker, self.info):
                seat.confirm_soon()  # the marker says over, slurmctld not yet: ask again shortly
        if verdict is None:
            await self.meter_cost(seat, answer)
            return None
        if self.settled_by_marker():
            size = view.size(self.log_path)  # stat'd after the marker: the whole log
        else:
            size = await self.size_of(seat.sftp, self.log_path)  # Slurm ended it: its last lines may be newer
        await self.finish_log(seat.sftp, size)
        return self.payload(self.after_budget(verdict), self.final_info())

    async def fall_back_if_short(self, seat: Seat) -> None:
        """The job is pending: when its partition's nodes are down for insufficient capacity (ParallelCluster's
        `(Code:InsufficientInstanceCapacity)...` reason), move it to the next capacity option's partition
        (`scontrol update`, as the job's own user: Slurm lets an owner move a pending job), and say so with
        that option's price. Asked at slurmctld's cadence, only while pending and only with options."""
        partition = (await seat.run(["squeue", "-h", "-j", self.job_id, "-o", "%P"])).strip()
        if not partition:
            return
        move = capacity.decide(
            self.capacity or [], partition, capacity.parse_nodes(await seat.run([*capacity.SINFO_NODES, partition]))
        )
        if move is None:
            return
        update = ["scontrol", "update", f"JobId={self.job_id}", f"Partition={move.to_partition}"]
        await seat.run(as_job_user(update, self.head_node.job_user))
        now_in = (await seat.run(["squeue", "-h", "-j", self.job_id, "-o", "%P"])).strip()
        if now_in != move.to_partition:  # refused (the partition's AllowAccounts), or the job started meanwhile
            self.log.warning(
                "capacity: could not move Slurm job %s to %s (it is in %r)", self.job_id, move.to_partition, now_in
            )
            return
        self.log.warning("%s", move.message(self.job_id))
        self.moves.append({"from": move.from_partition, "to": move.to_partition, "code": move.code, **move.option})
        seat.confirm_soon()  # see it start in its new partition

    async def release_held(self, seat: Seat, info: JobInfo) -> None:
        """The job is held after a failed launch (`watch.held_after_failed_launch`: after slurmctld was killed as
        it started, say) and nothing else would ever end the hold: `scontrol release` of this wait's own job, as
        its user, over the session's connection; a restart within max_restarts. A refusal is logged once and the
        release tried again at the next answer."""
        release = as_job_user(["scontrol", "release", self.job_id], self.head_node.job_user)
        status, _, said = await seat.call(release)
        if status != 0:
            if not self.release_refused:
                self.log.warning(
                    "Slurm job %s is held after a failed launch and `scontrol release` was refused (%s): tried again "
                    "at each answer from Slurm; a person's `scontrol release %s` ends the hold too",
                    self.job_id,
                    said.strip()[:500] or f"exit status {status}",
                    self.job_id,
                )
                self.release_refused = True
            return
        self.watch.released(info)
        self.log.warning(
            "Slurm job %s was held after a failed launch (%s; Slurm's restarts: %d): released it (release %d, within "
            "max_restarts=%d)",
            self.job_id,
            info.reason,
            info.restarts,
            self.watch.held_releases,
            self.watch_policy.max_restarts,
        )
        seat.confirm_soon()  # see it start again

    def marker_is_ours(self) -> bool:
        """Whether the exit marker names this job: a marker left by an earlier job in the same directory settles
        nothing."""
        return bool(self.marker) and str(self.marker.get("job_id")) == self.job_id

    def settled_by_marker(self) -> bool:
        """The job ended cleanly by its marker while Slurm, when last asked, still had it active."""
        active = self.info is None or self.info.state.is_active
        return active and ends_cleanly(self.marker, self.job_id, self.info)

    def final_info(self) -> JobInfo | None:
        """What Slurm said last, or what the marker says when it settled the job by itself."""
        return marker_job_info(self.marker, self.job_id, self.info) if self.settled_by_marker() else self.info

    def payload(self, verdict: Verdict, info: JobInfo | None) -> dict[str, Any]:
        """The event the operator's `execute_complete` reads: the verdict, Slurm's last word and the log's tail."""
        return {
            "status": "success" if verdict.outcome.ok else "failed",
            "outcome": str(verdict.outcome),
            "job_id": self.job_id,
            "run_dir": self.run_dir,
            "message": verdict.message,
            "exit_code": verdict.exit_code,
            "retryable": verdict.retryable,  # False: a failure a retry would repeat (outcomes.END_STATES)
            "job": info.as_dict() if info is not None else None,
            "log_offset": self.cursor.offset,
            "log_tail": list(self.cursor.tail),
            "capacity_moves": self.moves,  # the fallbacks the wait made (pcflow.capacity)
            "held_releases": self.watch.held_releases,  # holds after a failed launch the wait released
        }

    def error_payload(self, exc: Exception) -> dict[str, Any]:
        return {**super().error_payload(exc), "log_offset": self.cursor.offset, "log_tail": list(self.cursor.tail)}


class SlurmArrayTrigger(HeadNodeTrigger):
    """Fires once every element of a job array is over. Each ending element appends `<index> <exit
    code>` to `<run_dir>/done`: the session's stat notices it, the new lines name the elements whose
    markers to read, and slurmctld answers for all elements within the session's one `squeue -r`."""

    def __init__(
        self, *, size: int, min_success_ratio: float = 1.0, max_parallel: int | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.size = size
        self.min_success_ratio = min_success_ratio
        self.max_parallel = max_parallel  # the array's `%` throttle: at most this many elements run at once
        self.watch = ArrayWatch(self.job_id, size, self.watch_policy, min_success_ratio)
        self.progress = ArrayProgress(self.job_id, size)
        self.markers: dict[int, dict | None] = {}
        self.done_offset = 0

    def kwargs(self) -> dict[str, Any]:
        return {
            **super().kwargs(),
            "size": self.size,
            "min_success_ratio": self.min_success_ratio,
            "max_parallel": self.max_parallel,
        }

    @property
    def jobs_at_once(self) -> int:
        return self.size

    @property
    def running_at_most(self) -> int | None:
        return self.max_parallel

    @property
    def done_path(self) -> str:
        return posixpath.join(self.run_dir, "done")

    def marker_path(self, index: int) -> str:
        """Element `index`'s exit marker (each element writes its own, in its own directory)."""
        return posixpath.join(self.run_dir, str(index), "exit.json")

    @functools.cached_property
    def watched_paths(self) -> tuple[str, ...]:
        return (self.done_path,)

    def watched_jobs(self) -> dict[str, int | None]:
        return {self.job_id: self.size}

    async def read_done(self, sftp: asyncssh.SFTPClient, size: int | None) -> list[int]:
        """Elements that ended since the last poll, from the new whole lines of `done` (at most
        DONE_POLL_BYTES a poll: a job could write anything there)."""
        if size is None or size <= self.done_offset:
            return []
        try:
            async with open_job_file(sftp, self.done_path) as (fh, _):
                data = await fh.read(min(size - self.done_offset, DONE_POLL_BYTES), self.done_offset)
        except jobfiles.NotAJobFile as exc:
            jobfiles.refused(exc)
            return []
        whole = data[: data.rfind(b"\n") + 1]
        self.done_offset += len(whole) or (len(data) if len(data) == DONE_POLL_BYTES else 0)
        words = (line.split(b" ", 1)[0] for line in whole.splitlines())
        return list(dict.fromkeys(int(w) for w in words if w.isdigit() and int(w) < self.size))

    async def poll(self, seat: Seat, view: View) -> dict | None:
        ended = await self.read_done(seat.sftp, view.size(self.done_path))
        markers = await asyncio.gather(*(self.read_json(seat.sftp, self.marker_path(i)) for i in ended))
        self.markers.update(zip(ended, markers, strict=True))
        elements = view.answer(self.job_id)
        if elements is not None:
            await self.read_unreported_markers(seat.sftp, elements)
        verdict = self.watch.assess(elements, self.markers, view.now)
        self.note(self.progress.note(self.watch.counts()))
        if verdict is None:
            if elements is not None:
                await self.stop_running_trials_early(seat)
            if any(index not in self.watch.verdicts for index in ended):
                seat.confirm_soon()  # an element ended otherwise than cleanly: Slurm says why
            await self.meter_cost(seat, elements)
            return None
        verdict = self.after_budget(verdict)
        return {
            "status": "success" if verdict.outcome.ok else "failed",
            "outcome": str(verdict.outcome),
            "job_id": self.job_id,
            "run_dir": self.run_dir,
            "message": verdict.message,
            "elements": verdict.elements,
        }

    async def read_unreported_markers(self, sftp: asyncssh.SFTPClient, elements: list[JobInfo]) -> None:
        """squeue knows no exit codes and forgets ended elements: their markers fill both gaps (read once
        an element is over, when no `done` line brought it)."""
        known = {e.array_index: e for e in elements}
        for index in range(self.size):
            info = known.get(index)
            over = info is None or (info.state.is_terminal and info.exit_code is None)
            if over and index not in self.watch.verdicts and self.markers.get(index) is None:
                self.markers[index] = await self.read_json(sftp, self.marker_path(index))

    async def stop_running_trials_early(self, seat: Seat) -> None:
        """Apply the early-stopping rule to each running element not yet settled."""
        for index, info in self.watch.latest.items():
            if info.state is JobState.RUNNING and index not in self.watch.verdicts:
                await self.stop_early_if_due(seat, f"{self.job_id}_{index}", posixpath.join(self.run_dir, str(index)))
