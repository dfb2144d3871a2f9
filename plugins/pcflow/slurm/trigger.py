"""Wait for Slurm jobs in the triggerer: one SSH connection, the log streamed, no worker slot held.

Every `poll_interval` a trigger stats files over SFTP (the head node does a stat; slurmctld does
nothing): the job's log, whose new lines go to the task log, and the exit marker the batch script's
wrapper writes. slurmctld is asked every `confirm_interval`, and at once when a marker appears, which
is how the end of a job is noticed within about a second without polling the controller in a loop.

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
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncssh
from airflow.triggers.base import BaseTrigger, TriggerEvent

from pcflow.budget import CostMeter
from pcflow.slurm import queries
from pcflow.slurm.hook import (
    SMALL_FILE_BYTES,
    HostKeyMismatch,
    PinnedSSHHookAsync,
    json_object,
    quote_command,
    with_slurm_bin,
)
from pcflow.slurm.states import JobInfo, JobState
from pcflow.slurm.watch import ArrayWatch, JobWatch, LogCursor, Outcome, Verdict, WatchPolicy, marker_matches

CONNECTION_ERRORS = (OSError, asyncssh.Error, TimeoutError)
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
FAST_CONFIRM_S = 1.0  # while a marker says "over" but slurmctld still says running
SLURM_QUERIES = ("squeue", "sacct", "scontrol")


class HeadNodeTrigger(BaseTrigger):
    """One SSH + SFTP session to the head node, reopened with backoff; subclasses decide each poll."""

    def __init__(
        self,
        *,
        ssh_conn_id: str,
        job_id: str,
        run_dir: str,
        remote_host: str | None = None,
        host_key: str | None = None,
        accounting: bool = False,
        slurm_bin: str | None = None,
        policy: dict[str, Any] | None = None,
        max_reconnect_attempts: int = 8,
        command_timeout: float = 60.0,
        early_stopping: dict[str, Any] | None = None,
        budget: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.ssh_conn_id = ssh_conn_id
        self.job_id = job_id
        self.run_dir = run_dir
        self.remote_host = remote_host
        self.host_key = host_key
        self.accounting = accounting
        self.slurm_bin = slurm_bin
        self.policy = dict(policy or {})
        self.max_reconnect_attempts = max_reconnect_attempts
        self.command_timeout = command_timeout
        self.early_stopping = early_stopping
        self.stopped_early: set[str] = set()
        self.budget = budget
        self.budget_spent = False
        self.queries_sent = 0
        self.next_confirm: float | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{type(self).__module__}.{type(self).__qualname__}", self.kwargs()

    def kwargs(self) -> dict[str, Any]:
        return {
            "ssh_conn_id": self.ssh_conn_id,
            "job_id": self.job_id,
            "run_dir": self.run_dir,
            "remote_host": self.remote_host,
            "host_key": self.host_key,
            "accounting": self.accounting,
            "slurm_bin": self.slurm_bin,
            "policy": self.policy,
            "max_reconnect_attempts": self.max_reconnect_attempts,
            "command_timeout": self.command_timeout,
            "early_stopping": self.early_stopping,
            "budget": self.budget,
        }

    @functools.cached_property
    def watch_policy(self) -> WatchPolicy:
        return WatchPolicy(**self.policy)

    #: How many jobs of this wait may run at once (an array: its elements), for the budget's cadence.
    jobs_at_once = 1

    @functools.cached_property
    def meter(self) -> CostMeter | None:
        """The run's cost so far (the first task's prices and budget; `budget["run_started"]`: epoch s)."""
        if not self.budget:
            return None
        every = float(self.budget.get("report_every_s") or 300)
        return CostMeter(self.budget, float(self.budget["run_started"]), self.jobs_at_once, every)

    def confirm_due(self, now: float) -> bool:
        """The first question to slurmctld waits a full interval: until then the files tell us enough."""
        if self.next_confirm is None:
            self.next_confirm = now + self.watch_policy.confirm_interval
        return now >= self.next_confirm

    # -- remote access -------------------------------------------------------------------------

    async def connect(self) -> asyncssh.SSHClientConnection:
        hook = PinnedSSHHookAsync(ssh_conn_id=self.ssh_conn_id, host=self.remote_host, host_key=self.host_key)
        return await hook.get_conn()

    async def run_command(self, conn: asyncssh.SSHClientConnection, argv: list[str]) -> str:
        argv = with_slurm_bin(argv, self.slurm_bin)
        if posixpath.basename(argv[0]) in SLURM_QUERIES:
            self.queries_sent += 1
        result = await conn.run(quote_command(argv), check=False, timeout=self.command_timeout)
        out = result.stdout or ""
        return out.decode(errors="replace") if isinstance(out, bytes) else out

    async def ask_slurm(self, conn: asyncssh.SSHClientConnection, query) -> Any:
        return await queries.adrive(query, functools.partial(self.run_command, conn))

    @staticmethod
    async def read_bytes(sftp: asyncssh.SFTPClient, path: str, max_bytes: int = SMALL_FILE_BYTES) -> bytes | None:
        """A small file's bytes; None when it is absent or larger than `max_bytes` (not what pcflow wrote)."""
        try:
            async with sftp.open(path, "rb") as fh:
                data = await fh.read(max_bytes + 1)
        except asyncssh.SFTPNoSuchFile:
            return None
        return data if len(data) <= max_bytes else None

    @staticmethod
    async def read_tail(sftp: asyncssh.SFTPClient, path: str, max_bytes: int) -> tuple[bytes, int] | None:
        """The last `max_bytes` of a file and the offset they start at; None when it is absent."""
        try:
            async with sftp.open(path, "rb") as fh:
                size = (await fh.stat()).size or 0
                offset = max(0, size - max_bytes)
                return await fh.read(size - offset, offset), offset
        except asyncssh.SFTPNoSuchFile:
            return None

    @classmethod
    async def read_json(cls, sftp: asyncssh.SFTPClient, path: str) -> dict | None:
        """A small JSON object (a marker); None for anything else."""
        return json_object(await cls.read_bytes(sftp, path))

    async def stop_early_if_due(
        self, conn: asyncssh.SSHClientConnection, sftp: asyncssh.SFTPClient, job_id: str, trial_dir: str
    ) -> None:
        """Apply the run's early-stopping rule to a running trial (the wait already looks at it, so no
        other task has to: nothing waits for a job that was never submitted)."""
        if not self.early_stopping or job_id in self.stopped_early:
            return
        from pcflow.metrics.early_stop import evaluate, stop_trial

        decision = await evaluate(self, sftp, trial_dir, self.early_stopping)
        if decision.stop:
            await stop_trial(
                self, conn, sftp, job_id=job_id, trial_dir=trial_dir, rule=self.early_stopping, decision=decision
            )
            self.stopped_early.add(job_id)
            self.log.info("Stopping Slurm job %s early: %s after %d evaluations", job_id, decision.reason,
                          decision.evaluations)  # fmt: skip

    async def meter_cost(
        self, conn: asyncssh.SSHClientConnection, sftp: asyncssh.SFTPClient, infos: list[JobInfo] | None, now: float
    ) -> None:
        """Log the cost so far at its cadence (`infos`: Slurm's answer of this poll, if asked); at the
        budget, record it and cancel the job, once; ask Slurm again before the budget could be reached."""
        meter = self.meter
        if meter is None or self.budget_spent:
            return
        wall = time.time()
        if infos is not None:
            meter.observe(infos, wall)
        line = meter.report(wall)
        if line:
            self.log.info("%s", line)
        if meter.exhausted(wall):
            await self.stop_at_budget(conn, sftp, meter.record(self.job_id, wall))
            return
        ask = meter.ask_within(wall)
        if ask is not None and (self.next_confirm is None or now + ask < self.next_confirm):
            self.next_confirm = now + ask

    async def stop_at_budget(
        self, conn: asyncssh.SSHClientConnection, sftp: asyncssh.SFTPClient, record: dict[str, Any]
    ) -> None:
        """Write budget_exhausted.json into the run directory, then scancel the job (an array: all of it):
        the batch wrapper reads the record on SIGTERM and marks the attempt ended at its budget."""
        from pcflow.budget import BUDGET_FILE, usd

        # json.dumps' default spacing: the batch wrapper greps for `"job_id": "<its id>"` on SIGTERM.
        async with sftp.open(posixpath.join(self.run_dir, BUDGET_FILE), "wb") as fh:
            await fh.write(json.dumps(record).encode())
        await self.run_command(conn, ["scancel", self.job_id])
        self.budget_spent = True
        self.log.warning("The run's cost so far, %s, reached its budget of %s: cancelled Slurm job %s",
                         usd(record["cost_usd"]), usd(record["budget_usd"]), self.job_id)  # fmt: skip

    def after_budget(self, verdict: Any) -> Any:
        """A job cancelled at its budget before its wrapper could say so (still pending, an array's
        elements not started) ends `budget_exhausted` all the same."""
        if not self.budget_spent or verdict.outcome.ok:
            return verdict
        message = f"{verdict.message} (pcflow cancelled Slurm job {self.job_id} when the run reached its budget)"
        return dataclasses.replace(verdict, outcome=Outcome.BUDGET_EXHAUSTED, message=message)

    @staticmethod
    async def size_of(sftp: asyncssh.SFTPClient, path: str) -> int | None:
        try:
            return (await sftp.stat(path)).size or 0
        except asyncssh.SFTPNoSuchFile:
            return None

    @staticmethod
    async def close(conn: asyncssh.SSHClientConnection | None) -> None:
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
                await conn.wait_closed()

    # -- the wait ------------------------------------------------------------------------------

    async def poll(self, conn: asyncssh.SSHClientConnection, sftp: asyncssh.SFTPClient, now: float) -> dict | None:
        """Look once; return the event payload when the wait is over."""
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
        loop = asyncio.get_running_loop()
        conn: asyncssh.SSHClientConnection | None = None
        sftp: asyncssh.SFTPClient | None = None
        failures = 0
        try:
            while True:
                try:
                    if conn is None:
                        conn = await self.connect()
                        sftp = await conn.start_sftp_client()
                    payload = await self.poll(conn, sftp, loop.time())
                    failures = 0
                except CONNECTION_ERRORS as exc:
                    failures += 1
                    await self.close(conn)
                    conn = sftp = None
                    if failures > self.max_reconnect_attempts:
                        raise
                    delay = min(2 ** (failures - 1), 30) * random.uniform(1.0, 1.5)
                    self.log.warning(
                        "SSH to the head node failed (attempt %d/%d), reconnecting in %.1fs: %s",
                        failures,
                        self.max_reconnect_attempts,
                        delay,
                        exc,
                    )
                    await asyncio.sleep(delay)
                    continue
                if payload is not None:
                    yield TriggerEvent({**payload, "slurm_queries": self.queries_sent})
                    return
                await asyncio.sleep(self.watch_policy.poll_interval)
        except Exception as exc:
            self.log.exception("Waiting for Slurm job %s failed", self.job_id)
            yield TriggerEvent(self.error_payload(exc))
        finally:
            await self.close(conn)

    async def on_kill(self) -> None:
        """A user killed the deferred task: cancel the job so it stops using (and billing) nodes."""
        conn = await self.connect()
        try:
            await self.run_command(conn, ["scancel", self.job_id])
            self.log.info("Cancelled Slurm job %s because the task was killed", self.job_id)
        finally:
            await self.close(conn)


class SlurmJobTrigger(HeadNodeTrigger):
    """Fires once, when one job is over for good (requeues included) or the wait gives up."""

    def __init__(self, *, log_offset: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.log_offset = log_offset
        self.watch = JobWatch(self.job_id, self.watch_policy)
        self.cursor = LogCursor(offset=log_offset)
        self.last_marker: dict | None = None

    def kwargs(self) -> dict[str, Any]:
        return {**super().kwargs(), "log_offset": self.log_offset}

    @property
    def log_path(self) -> str:
        return posixpath.join(self.run_dir, "job.log")

    async def stream_log(self, sftp: asyncssh.SFTPClient) -> bool:
        """New lines of the job log into the task log, within one poll's budget; True when more is left."""
        size = await self.size_of(sftp, self.log_path)
        if size is None:
            return False
        if size < self.cursor.offset:
            self.log.warning("Job log %s shrank (%d < %d bytes); reading it again", self.log_path, size,
                             self.cursor.offset)  # fmt: skip
            self.cursor.offset = 0
        if size - self.cursor.offset > LOG_MAX_BEHIND:
            self.skip_log(size - LOG_POLL_BYTES)
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
        skipped = self.cursor.skip_to(offset)
        self.log.warning("Skipped %d bytes of the job log: it grows faster than the task log can follow. All of "
                         "it is in %s on the cluster.", skipped, self.log_path)  # fmt: skip

    async def finish_log(self, sftp: asyncssh.SFTPClient) -> None:
        """The job is over: what is left of its log, or, when that is much, its last lines."""
        for _ in range(LOG_FINAL_POLLS):
            if not await self.stream_log(sftp):
                break
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

    async def poll(self, conn: asyncssh.SSHClientConnection, sftp: asyncssh.SFTPClient, now: float) -> dict | None:
        await self.stream_log(sftp)
        marker = await self.read_json(sftp, posixpath.join(self.run_dir, "exit.json"))
        if marker and marker != self.last_marker:
            self.last_marker, self.next_confirm = marker, now
        if not self.confirm_due(now):
            await self.meter_cost(conn, sftp, None, now)
            return None
        info = await self.ask_slurm(conn, queries.job_info(self.job_id, self.accounting))
        verdict = self.watch.assess(info, marker, now)
        if verdict is None and info is not None and info.state is JobState.RUNNING:
            await self.stop_early_if_due(conn, sftp, self.job_id, self.run_dir)
        if verdict is None:
            fast = info is not None and marker_matches(marker, info)
            self.next_confirm = now + (FAST_CONFIRM_S if fast else self.watch_policy.confirm_interval)
            await self.meter_cost(conn, sftp, [info] if info is not None else [], now)  # may ask sooner
            return None
        await self.finish_log(sftp)
        return self.payload(self.after_budget(verdict), info)

    def payload(self, verdict: Verdict, info: JobInfo | None) -> dict[str, Any]:
        return {
            "status": "success" if verdict.outcome.ok else "failed",
            "outcome": str(verdict.outcome),
            "job_id": self.job_id,
            "run_dir": self.run_dir,
            "message": verdict.message,
            "exit_code": verdict.exit_code,
            "job": info.as_dict() if info is not None else None,
            "log_offset": self.cursor.offset,
            "log_tail": list(self.cursor.tail),
        }

    def error_payload(self, exc: Exception) -> dict[str, Any]:
        return {**super().error_payload(exc), "log_offset": self.cursor.offset, "log_tail": list(self.cursor.tail)}


class SlurmArrayTrigger(HeadNodeTrigger):
    """Fires once every element of a job array is over. Each finishing element appends a line to
    `<run_dir>/done`, so one stat per poll notices progress; slurmctld answers for all elements
    with a single `squeue -r`."""

    def __init__(self, *, size: int, min_success_ratio: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.size = size
        self.min_success_ratio = min_success_ratio
        self.watch = ArrayWatch(self.job_id, size, self.watch_policy, min_success_ratio)
        self.done_size = 0

    def kwargs(self) -> dict[str, Any]:
        return {**super().kwargs(), "size": self.size, "min_success_ratio": self.min_success_ratio}

    @property
    def jobs_at_once(self) -> int:
        return self.size

    async def poll(self, conn: asyncssh.SSHClientConnection, sftp: asyncssh.SFTPClient, now: float) -> dict | None:
        done_size = await self.size_of(sftp, posixpath.join(self.run_dir, "done")) or 0
        if done_size != self.done_size:
            self.done_size, self.next_confirm = done_size, now
        if not self.confirm_due(now):
            await self.meter_cost(conn, sftp, None, now)
            return None
        elements = await self.ask_slurm(conn, queries.array_elements(self.job_id, self.accounting))
        # squeue knows no exit codes and forgets finished elements: their markers fill both gaps.
        known = {e.array_index: e for e in elements}
        markers = {}
        for index in range(self.size):
            info = known.get(index)
            if info is None or (info.state.is_terminal and info.exit_code is None):
                markers[index] = await self.read_json(sftp, posixpath.join(self.run_dir, str(index), "exit.json"))
        verdict = self.watch.assess(elements, markers, now)
        if verdict is None:
            for index, info in known.items():
                if info.state is JobState.RUNNING and index is not None:
                    trial_dir = posixpath.join(self.run_dir, str(index))
                    await self.stop_early_if_due(conn, sftp, f"{self.job_id}_{index}", trial_dir)
            self.next_confirm = now + self.watch_policy.confirm_interval
            await self.meter_cost(conn, sftp, elements, now)  # may ask sooner
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
