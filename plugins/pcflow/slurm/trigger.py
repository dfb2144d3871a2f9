"""Wait for a Slurm job in the triggerer: one SSH connection, the log streamed, no worker slot held.

Every `poll_interval` the trigger stats the job's log and exit marker over SFTP (the head node does a
stat; slurmctld does nothing) and forwards new log lines to the task log. slurmctld is asked every
`confirm_interval`, and at once when the wrapper's exit marker appears, which is how the end of a
job is noticed within about a second without polling the controller in a tight loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import posixpath
import random
from collections.abc import AsyncIterator
from typing import Any

import asyncssh
from airflow.triggers.base import BaseTrigger, TriggerEvent

from pcflow.slurm import queries
from pcflow.slurm.hook import PinnedSSHHookAsync, quote_command
from pcflow.slurm.watch import JobWatch, LogCursor, Verdict, WatchPolicy, marker_matches

CONNECTION_ERRORS = (OSError, asyncssh.Error, TimeoutError)
LOG_CHUNK_BYTES = 1 << 20
FAST_CONFIRM_S = 1.0  # while a marker says "over" but slurmctld still says running


class SlurmJobTrigger(BaseTrigger):
    """Fires once, when the job is over for good (requeues included) or the wait gives up."""

    def __init__(
        self,
        *,
        ssh_conn_id: str,
        remote_host: str | None = None,
        host_key: str | None = None,
        job_id: str,
        run_dir: str,
        log_offset: int = 0,
        accounting: bool = False,
        slurm_bin: str | None = None,
        policy: dict[str, Any] | None = None,
        max_reconnect_attempts: int = 8,
        command_timeout: float = 60.0,
    ) -> None:
        super().__init__()
        self.ssh_conn_id = ssh_conn_id
        self.remote_host = remote_host
        self.host_key = host_key
        self.job_id = job_id
        self.run_dir = run_dir
        self.log_offset = log_offset
        self.accounting = accounting
        self.slurm_bin = slurm_bin
        self.policy = dict(policy or {})
        self.max_reconnect_attempts = max_reconnect_attempts
        self.command_timeout = command_timeout
        self.queries_sent = 0

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "ssh_conn_id": self.ssh_conn_id,
                "remote_host": self.remote_host,
                "host_key": self.host_key,
                "job_id": self.job_id,
                "run_dir": self.run_dir,
                "log_offset": self.log_offset,
                "accounting": self.accounting,
                "slurm_bin": self.slurm_bin,
                "policy": self.policy,
                "max_reconnect_attempts": self.max_reconnect_attempts,
                "command_timeout": self.command_timeout,
            },
        )

    # -- remote access -------------------------------------------------------------------------

    async def _connect(self) -> asyncssh.SSHClientConnection:
        hook = PinnedSSHHookAsync(ssh_conn_id=self.ssh_conn_id, host=self.remote_host, host_key=self.host_key)
        return await hook.get_conn()

    async def _run(self, conn: asyncssh.SSHClientConnection, argv: list[str]) -> str:
        if self.slurm_bin and argv[0] in ("squeue", "sacct", "scontrol", "scancel"):
            argv = [posixpath.join(self.slurm_bin, argv[0]), *argv[1:]]
        if argv[0].endswith(("squeue", "sacct", "scontrol")):
            self.queries_sent += 1
        result = await conn.run(quote_command(argv), check=False, timeout=self.command_timeout)
        out = result.stdout or ""
        return out.decode(errors="replace") if isinstance(out, bytes) else out

    @staticmethod
    async def _read_marker(sftp: asyncssh.SFTPClient, path: str) -> dict | None:
        try:
            async with sftp.open(path, "rb") as fh:
                return json.loads(await fh.read())
        except (asyncssh.SFTPNoSuchFile, json.JSONDecodeError, UnicodeDecodeError):
            return None

    async def _stream_log(self, sftp: asyncssh.SFTPClient, path: str, cursor: LogCursor) -> None:
        try:
            size = (await sftp.stat(path)).size or 0
        except asyncssh.SFTPNoSuchFile:
            return
        if size < cursor.offset:
            self.log.warning("Job log %s shrank (%d < %d bytes); reading it from the start", path, size, cursor.offset)
            cursor.offset = 0
        while size > cursor.offset:
            async with sftp.open(path, "rb") as fh:
                chunk = await fh.read(min(size - cursor.offset, LOG_CHUNK_BYTES), cursor.offset)
            if not chunk:
                return
            for line in cursor.feed(chunk):
                self.log.info("%s", line)

    @staticmethod
    async def _close(conn: asyncssh.SSHClientConnection | None) -> None:
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
                await conn.wait_closed()

    # -- the wait ------------------------------------------------------------------------------

    async def run(self) -> AsyncIterator[TriggerEvent]:
        policy = WatchPolicy(**self.policy)
        watch = JobWatch(self.job_id, policy)
        cursor = LogCursor(offset=self.log_offset)
        log_path = posixpath.join(self.run_dir, "job.log")
        marker_path = posixpath.join(self.run_dir, "exit.json")
        loop = asyncio.get_running_loop()
        conn: asyncssh.SSHClientConnection | None = None
        sftp: asyncssh.SFTPClient | None = None
        failures = 0
        next_confirm = 0.0
        last_marker: dict | None = None
        try:
            while True:
                try:
                    if conn is None:
                        conn = await self._connect()
                        sftp = await conn.start_sftp_client()
                    await self._stream_log(sftp, log_path, cursor)
                    marker = await self._read_marker(sftp, marker_path)
                    now = loop.time()
                    if marker and marker != last_marker:
                        last_marker, next_confirm = marker, now
                    if now >= next_confirm:
                        info = await queries.adrive(
                            queries.job_info(self.job_id, self.accounting), functools.partial(self._run, conn)
                        )
                        verdict = watch.assess(info, marker, now)
                        if verdict is not None:
                            await self._stream_log(sftp, log_path, cursor)
                            for line in cursor.flush():
                                self.log.info("%s", line)
                            yield TriggerEvent(self._event(verdict, info, cursor))
                            return
                        fast = info is not None and marker_matches(marker, info)
                        next_confirm = now + (FAST_CONFIRM_S if fast else policy.confirm_interval)
                    failures = 0
                except CONNECTION_ERRORS as exc:
                    failures += 1
                    await self._close(conn)
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
                await asyncio.sleep(policy.poll_interval)
        except Exception as exc:
            self.log.exception("Waiting for Slurm job %s failed", self.job_id)
            yield TriggerEvent(
                {
                    "status": "error",
                    "outcome": "error",
                    "job_id": self.job_id,
                    "run_dir": self.run_dir,
                    "message": f"Lost track of Slurm job {self.job_id}: {exc}. The job itself was not touched; "
                    "a retry of the task re-attaches to it.",
                    "log_offset": cursor.offset,
                    "log_tail": list(cursor.tail),
                }
            )
        finally:
            await self._close(conn)

    def _event(self, verdict: Verdict, info, cursor: LogCursor) -> dict[str, Any]:
        return {
            "status": "success" if verdict.outcome == "success" else "failed",
            "outcome": str(verdict.outcome),
            "job_id": self.job_id,
            "run_dir": self.run_dir,
            "message": verdict.message,
            "exit_code": verdict.exit_code,
            "job": info.as_dict() if info is not None else None,
            "log_offset": cursor.offset,
            "log_tail": list(cursor.tail),
            "slurm_queries": self.queries_sent,
        }

    async def on_kill(self) -> None:
        """A user killed the deferred task: cancel the job so it stops using (and billing) nodes."""
        conn = await self._connect()
        try:
            await self._run(conn, ["scancel", self.job_id])
            self.log.info("Cancelled Slurm job %s because the task was killed", self.job_id)
        finally:
            await self._close(conn)
