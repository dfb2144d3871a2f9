"""Talk to a Slurm cluster's login/head node over SSH: commands as argument lists, files over SFTP.

Built on the SSH provider's `SSHHook` (paramiko), so host keys, key files and proxies come from the
Airflow connection as usual. Two connection extras are pcflow's own:
`shared_root` (a directory every node sees, e.g. `/fsx` on ParallelCluster) and `slurm_bin`
(where sbatch & co. live when they are not on a non-login shell's PATH, e.g. `/opt/slurm/bin`).
The `slurm` connection type shows them, and the SSH provider's `host_key`, as form fields
(pcflow.provider_info); a connection of type `ssh` with the same extras works the same.

A cluster pcflow created itself has an address and a host key known only at run time: both travel
with the connection id as one `HeadNode` (pcflow.slurm.head_node), so the key is still pinned, never
trusted on first use. The provider's hooks are given them through their own inputs (the connection they
read), never by changing a hook after it is made.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import posixpath
import random
import shlex
import stat
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import IO, TYPE_CHECKING, Any

import attrs
import paramiko
from airflow.providers.common.compat.connection import get_async_connection
from airflow.providers.ssh.hooks.ssh import SSHHook, SSHHookAsync
from airflow.sdk import BaseHook

from pcflow.errors import PcflowError, PcflowInputError, connection_admin
from pcflow.jobstates import JobInfo
from pcflow.slurm import DEFAULT_SSH_CONN_ID, jobfiles, queries
from pcflow.slurm.head_node import HeadNode, head_node_argument

if TYPE_CHECKING:
    import asyncssh
    from airflow.sdk import Connection
    from paramiko.sftp_client import SFTPClient

DEADLINE_GRACE_S = 5.0
CONNECT_RETRY_DELAY_S = 3.0
#: The most any one read of a remote file returns: jobs write those files, so none is read whole unasked.
MAX_READ_BYTES = 64 * 1024 * 1024
#: Exit markers, `submitted`, early_stop.json hold a line of JSON: a larger file is not one of them.
SMALL_FILE_BYTES = 64 * 1024
#: What a command's error stream (and a command fed input: `tar -x`, sbatch) keeps: its message, not a flood.
MAX_ERROR_BYTES = 64 * 1024
READ_PIECE_BYTES = 1024 * 1024
#: Exports the NUL-separated `NAME=value` pairs on standard input, then runs its arguments (bash for
#: `read -d ''`; names were checked as shell identifiers, values hold no NUL).
EXPORT_INPUT_PAIRS = 'while IFS= read -r -d \'\' kv; do export "$kv"; done; exec "$@"'
SLURM_COMMANDS = frozenset({"sbatch", "squeue", "sacct", "scontrol", "scancel", "sinfo", "srun", "sacctmgr"})


class SlurmError(PcflowError):
    """A Slurm or SSH operation failed; the message says what to do about it."""


class SlurmConnectionError(SlurmError):
    """The head node could not be reached or authenticated."""


class HostKeyNotPinned(SlurmConnectionError, PcflowInputError):
    """The connection turns host key checking off and nothing pins the head node's key: the admin's to
    fix, so not retried."""


class HostKeyMismatch(SlurmConnectionError, PcflowInputError):
    """The head node's host key is not the pinned one: not transient, so no retry (of the connection or
    the task) tries again; a person decides whether the node was rebuilt or the connection intercepted."""


@dataclass(frozen=True)
class CommandResult:
    """A finished remote command: callers decide with `check` (or the exit code) whether failure matters."""

    argv: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str

    def check(self) -> CommandResult:
        """Itself when the command succeeded; else a SlurmError with the end of its output (and a hint when the
        disk is full)."""
        if self.exit_code != 0:
            detail = (self.stderr or self.stdout).strip()[-2000:]
            hint = " The cluster's disk is full: free space under the shared root." if "No space" in detail else ""
            raise SlurmError(f"`{shlex.join(self.argv)}` failed with exit code {self.exit_code}: {detail}.{hint}")
        return self


#: How the SSH user runs a Slurm command as the run's job account: never a password prompt (-n: a head node
#: without the sudoers rule fails at once, saying so), its environment kept (-E: a site's SLURM_CONF), the
#: account's own HOME (-H: not the SSH user's, which a job must not write).
SUDO_AS = ("sudo", "-n", "-E", "-H", "-u")


def as_job_user(argv: Sequence[str], job_user: str | None) -> list[str]:
    """`argv` run as `job_user` through sudo (the job's own account owns its jobs: only it, or an admin,
    may cancel or requeue them); unchanged without one."""
    return [*SUDO_AS, job_user, "--", *argv] if job_user else list(argv)


def with_slurm_bin(argv: Sequence[str], slurm_bin: str | None) -> list[str]:
    """Slurm's commands from `slurm_bin` when they are not on a non-login shell's PATH (nor on sudo's
    secure_path: the command after `as_job_user`'s prefix is the one rewritten)."""
    argv = list(argv)
    at = argv.index("--") + 1 if argv[:1] == ["sudo"] and "--" in argv else 0
    if slurm_bin and len(argv) > at and argv[at] in SLURM_COMMANDS:
        argv[at] = posixpath.join(slurm_bin, argv[at])
    return argv


def quote_command(argv: Sequence[str]) -> str:
    """The one place a command line is built: every element quoted, so values stay values."""
    if not argv or any(not isinstance(a, str) for a in argv):
        raise TypeError(f"a command is a non-empty list of strings, got {argv!r}")
    return shlex.join(argv)


def bounded_read(stream: IO[bytes], limit: int) -> str:
    """The first `limit` bytes of a command's stream as text; the rest is read and dropped (a command
    that still writes must not block on a full SSH window), with a note of how much was dropped."""
    kept = stream.read(limit)
    dropped = 0
    while chunk := stream.read(1 << 20):
        dropped += len(chunk)
    text = kept.decode(errors="replace")
    return f"{text} [... {dropped} more bytes not shown]" if dropped else text


def json_object(data: bytes | None, max_bytes: int = SMALL_FILE_BYTES) -> dict | None:
    """A small JSON object read from a file a job could have written; None for anything else."""
    if not data or len(data) > max_bytes:
        return None
    try:
        value = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def sftp_status(attrs: Any) -> jobfiles.Status:
    """What `jobfiles` compares of a status paramiko's SFTP client gives (`lstat`, an open file's `stat`)."""
    return jobfiles.Status(attrs.st_mode or 0, attrs.st_uid, attrs.st_gid)


def head_node_connection(conn: Connection, head_node: HeadNode) -> Connection:
    """The connection as this head node amends it: its address instead of the connection's host, and its
    key pinned where the connection pins none (an admin's own `host_key` extra always wins), checked. A
    form field left empty (null or "") counts as not set, as in `SlurmHook.extras`.

    Once a key is pinned, by the connection or the run, it is checked whatever `no_host_key_check` says:
    the provider's hooks would otherwise drop the run's key (the async hook then trusts any server) or
    refuse the connection. A connection that turns checking off and pins nothing is refused: pcflow never
    talks to a head node it cannot identify."""
    extra = {k: v for k, v in conn.extra_dejson.items() if v not in (None, "")}
    key = extra.get("host_key") or head_node.host_key
    if key is None and str(extra.get("no_host_key_check", "false")).lower() == "true":
        raise HostKeyNotPinned(
            f"connection {head_node.conn_id!r} turns host key checking off (extra no_host_key_check) and pins no "
            "key: pcflow does not connect to a head node it cannot identify. The Airflow admin puts the head "
            "node's public host key (`<type> <base64>`) in the connection's `host_key` extra and removes "
            f"no_host_key_check. Not retried; {connection_admin(head_node.conn_id)}"
        )
    if key is not None:
        extra = {**extra, "host_key": key, "no_host_key_check": False}
    return attrs.evolve(conn, host=head_node.address or conn.host, extra=json.dumps(extra))


class HeadNodeSSHHook(SSHHook):
    """The provider's SSH hook reading the connection as the head node amends it: the provider itself
    parses and checks the pinned key (strictly: an unknown host is refused, never added)."""

    def __init__(self, head_node: HeadNode, **kwargs: Any) -> None:
        self.head_node = head_node  # read by get_connection, which the provider's __init__ calls
        super().__init__(ssh_conn_id=head_node.conn_id, remote_host=head_node.address or "", **kwargs)

    def get_connection(self, conn_id: str) -> Connection:  # type: ignore[override]
        return head_node_connection(super().get_connection(conn_id), self.head_node)


class HeadNodeSSHHookAsync(SSHHookAsync):
    """The provider's async hook reading the connection as the head node amends it, as the sync hook
    does: one rule for which key is pinned, in the worker and in the triggerer alike."""

    def __init__(self, head_node: HeadNode, **kwargs: Any) -> None:
        self.head_node = head_node
        super().__init__(ssh_conn_id=head_node.conn_id, host=head_node.address, **kwargs)

    def _parse_extras(self, conn: Any) -> None:
        super()._parse_extras(head_node_connection(conn, self.head_node))


async def connect_async(head_node: HeadNode) -> asyncssh.SSHClientConnection:
    """An asyncssh connection to the head node through the provider's async hook, the key pinned as in
    the sync hook (the connection's own `host_key` extra, if any, wins)."""
    import asyncssh

    try:
        return await HeadNodeSSHHookAsync(head_node).get_conn()
    except asyncssh.HostKeyNotVerifiable as exc:
        raise HostKeyMismatch(await async_mismatch_message(head_node)) from exc


async def async_mismatch_message(head_node: HeadNode) -> str:
    """asyncssh's refusal names no key: ask the server for its key of the pinned type to show both."""
    import asyncssh

    conn = await get_async_connection(head_node.conn_id)
    host, port = head_node.address or conn.host, conn.port or 22
    pinned = (conn.extra_dejson.get("host_key") or head_node.host_key or "").split()[:2]
    served = None
    try:
        asked = asyncssh.get_server_host_key(host, port, server_host_key_algs=pinned[:1] or ())
        key = await asyncio.wait_for(asked, 30)
        served = key.get_fingerprint("sha256") if key is not None else None
    except (OSError, asyncssh.Error, TimeoutError):
        pass
    expected = fingerprint(base64.b64decode(pinned[1])) if len(pinned) == 2 else None
    return host_key_message(head_node.conn_id, host, served, expected)


def fingerprint(key_blob: bytes) -> str:
    """A public key's fingerprint as `ssh-keygen -l` and ssh's own warnings print it."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(key_blob).digest()).decode().rstrip("=")


def host_key_message(conn_id: str, host: str, served: str | None, expected: str | None) -> str:
    """The refusal of a host key that is not the pinned one, with both fingerprints: a person must decide
    whether the node was rebuilt or the connection intercepted, so the message says how to tell."""
    return (
        f"The SSH host key of {host} does not match the key pinned in connection {conn_id!r}: the server "
        f"sent {served or 'a key that could not be read again'}, the pinned key is {expected or 'unknown'}. "
        "If the head node was rebuilt, update the connection's `host_key` extra (or the cluster's recorded "
        f"key); otherwise someone may be intercepting the connection. Not retried; {connection_admin(conn_id)}"
    )


class SlurmHook(BaseHook):
    """Submit, inspect and cancel Slurm jobs on a head node reached through an SSH connection."""

    conn_name_attr = "ssh_conn_id"
    default_conn_name = DEFAULT_SSH_CONN_ID
    conn_type = "slurm"  # its form: pcflow.provider_info
    hook_name = "Slurm (SSH)"

    def __init__(
        self,
        head_node: HeadNode | Mapping[str, Any] | str | None = None,
        *,
        ssh_conn_id: str | None = None,
        remote_host: str | None = None,
        host_key: str | None = None,
        command_timeout: float = 120,
        connect_attempts: int = 3,
        **kwargs: Any,
    ) -> None:
        """`head_node`: a HeadNode (or its dict), or just a connection id. Or, as before HeadNode, its
        parts: `ssh_conn_id` (the name Airflow's `Connection.get_hook` passes), `remote_host`, `host_key`."""
        super().__init__(**kwargs)
        self.head_node = HeadNode.of(head_node_argument(head_node, ssh_conn_id, remote_host, host_key))
        self.command_timeout = command_timeout
        self.connect_attempts = connect_attempts
        self._client: paramiko.SSHClient | None = None
        self._sftp: SFTPClient | None = None

    @property
    def ssh_conn_id(self) -> str:
        return self.head_node.conn_id

    @cached_property
    def ssh_hook(self) -> SSHHook:
        return HeadNodeSSHHook(
            self.head_node,
            cmd_timeout=self.command_timeout,
            conn_retry_attempts=1,  # _connect retries, except on a host key mismatch
        )

    @cached_property
    def extras(self) -> dict[str, Any]:
        """The connection's extras; a form field left empty (null or "") counts as not set."""
        return {k: v for k, v in self.get_connection(self.ssh_conn_id).extra_dejson.items() if v not in (None, "")}

    @property
    def login(self) -> str:
        """The user pcflow's jobs run as on the cluster: the connection's SSH login."""
        return self.ssh_hook.username

    @property
    def job_user(self) -> str | None:
        """The account the run's jobs run as (`HeadNode.job_user`); None: the SSH user itself."""
        return self.head_node.job_user

    @property
    def shared_root(self) -> str | None:
        return self.extras.get("shared_root")

    def _slurm_argv(self, argv: Sequence[str]) -> list[str]:
        return with_slurm_bin(argv, self.extras.get("slurm_bin"))

    # -- connection ----------------------------------------------------------------------------

    def get_conn(self) -> paramiko.SSHClient:
        """One SSH connection per hook, reopened when it has dropped."""
        transport = self._client.get_transport() if self._client else None
        if transport is None or not transport.is_active():
            self.close()
            try:
                self._client = self._connect()
            except paramiko.BadHostKeyException as exc:
                served, pinned = fingerprint(exc.key.asbytes()), fingerprint(exc.expected_key.asbytes())
                raise HostKeyMismatch(host_key_message(self.ssh_conn_id, exc.hostname, served, pinned)) from exc
            except paramiko.AuthenticationException as exc:
                raise SlurmConnectionError(
                    f"SSH authentication to connection {self.ssh_conn_id!r} failed ({exc}): check its login "
                    "and key_file/private_key, and that the key is in the user's authorized_keys."
                ) from exc
            except paramiko.SSHException as exc:
                raise SlurmConnectionError(
                    f"SSH to connection {self.ssh_conn_id!r} failed: {exc}. If the host key is not pinned, add "
                    "the server's key as the connection's `host_key` extra."
                ) from exc
            except OSError as exc:
                raise SlurmConnectionError(
                    f"Cannot reach the head node of connection {self.ssh_conn_id!r}: {exc}. Check host, port "
                    "and that the cluster is up."
                ) from exc
        return self._client

    def _connect(self) -> paramiko.SSHClient:
        """The provider hook connects once a call (its own retries would try a wrong host key again);
        a failure that may pass is tried again here, up to connect_attempts."""
        for attempt in range(1, self.connect_attempts + 1):
            try:
                return self.ssh_hook.get_conn()
            except paramiko.BadHostKeyException:
                raise
            except (paramiko.SSHException, OSError) as exc:
                if attempt == self.connect_attempts:
                    raise
                self.log.info("SSH connection attempt %d failed (%s); trying again", attempt, exc)
                time.sleep(CONNECT_RETRY_DELAY_S * random.uniform(1.0, 1.5))
        raise AssertionError("unreachable")

    @property
    def sftp(self) -> SFTPClient:
        client = self.get_conn()
        if self._sftp is None or self._sftp.get_channel().closed:
            with self._deadline(client, self.command_timeout, "the SFTP subsystem request"):
                self._sftp = client.open_sftp()
            # Every later SFTP reply is awaited at most this long (a stalled server raises, never hangs).
            self._sftp.get_channel().settimeout(self.command_timeout)
        return self._sftp

    @contextmanager
    def _deadline(self, client: paramiko.SSHClient, seconds: float, what: str) -> Iterator[None]:
        """paramiko waits without limit for some answers (an exec or subsystem request, an exit
        status): a head node that stops answering would hang the task for good. Closing the transport
        wakes every waiter, so past the deadline the call fails, and the next one reconnects."""
        transport = client.get_transport()
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            if transport is not None:
                transport.close()

        # Past paramiko's own timeouts (same `seconds`), so a channel that never opened still raises
        # paramiko's error first, which `run` answers with one reconnect.
        timer = threading.Timer(seconds + DEADLINE_GRACE_S, expire)
        timer.daemon = True
        timer.start()
        try:
            yield
        except Exception as exc:
            if expired.is_set() or isinstance(exc, TimeoutError):
                raise SlurmConnectionError(self._stalled(what, seconds)) from exc
            raise
        finally:
            timer.cancel()
        if expired.is_set():
            raise SlurmConnectionError(self._stalled(what, seconds))

    @contextmanager
    def _sftp_request(self, what: str) -> Iterator[SFTPClient]:
        """An SFTP call whose reply did not come in time drops the connection: a late reply must
        never be read as the answer to the next request."""
        try:
            yield self.sftp
        except TimeoutError as exc:
            self.close()
            raise SlurmConnectionError(self._stalled(what, self.command_timeout)) from exc

    def _stalled(self, what: str, seconds: float) -> str:
        return (
            f"The head node of connection {self.ssh_conn_id!r} did not answer {what} within {seconds:.0f} s, "
            "so the SSH connection was closed. Check the head node's load and its sshd; a slow but healthy "
            "head node needs a larger command_timeout."
        )

    def close(self) -> None:
        """Close the SFTP channel and the connection; safe when they are already broken or were never opened."""
        for closable in (self._sftp, self._client):
            if closable is not None:
                try:
                    closable.close()
                except Exception:  # already broken: nothing to release
                    self.log.debug("ignored error while closing SSH resources", exc_info=True)
        self._sftp = self._client = None

    # -- commands and files --------------------------------------------------------------------

    def run(self, argv: Sequence[str], *, check: bool = True, timeout: float | None = None) -> CommandResult:
        """Run one command on the head node; `argv` is quoted element by element. `timeout` bounds
        the whole command, output and exit status included."""
        argv = tuple(self._slurm_argv(argv))
        command = quote_command(argv)
        limit = timeout or self.command_timeout
        try:
            result = self._exec(argv, command, limit)
        except paramiko.SSHException as exc:
            # Only when the channel never opened is the command known not to have run (sbatch must not
            # run twice): then one more try on a new connection is safe.
            if not (isinstance(exc, paramiko.ChannelException) or "opening channel" in str(exc)):
                raise
            self.log.warning("SSH channel to the head node failed (%s); reconnecting once", exc)
            self.close()
            result = self._exec(argv, command, limit)
        return result.check() if check else result

    def _exec(self, argv: tuple[str, ...], command: str, limit: float) -> CommandResult:
        client = self.get_conn()
        with self._deadline(client, limit, f"`{shlex.join(argv)[:200]}`"):
            stdout, stderr = self._open_exec(client, command, limit)
            out = stdout.read(MAX_READ_BYTES + 1)
            if len(out) > MAX_READ_BYTES:
                stdout.channel.close()
                raise SlurmError(
                    f"`{shlex.join(argv)[:200]}` printed more than {MAX_READ_BYTES // 1024**2} MiB: not read further"
                )
            err = bounded_read(stderr, MAX_ERROR_BYTES)
            code = stdout.channel.recv_exit_status()
        return CommandResult(argv, code, out.decode(errors="replace"), err)

    @staticmethod
    def _open_exec(client: paramiko.SSHClient, command: str, limit: float) -> tuple[IO[bytes], IO[bytes]]:
        """`SSHClient.exec_command` without the stdin file a command that reads nothing never needs: that
        file's `__del__` takes the channel's lock, and when the garbage collector ran it on paramiko's
        transport thread while that thread held the lock, the connection hung for good (seen in CI: every
        later channel open timed out, and closing the client waited forever)."""
        transport = client.get_transport()
        if transport is None:
            raise paramiko.SSHException("SSH session not active")
        channel = transport.open_session(timeout=limit)
        channel.settimeout(limit)
        channel.exec_command(command)
        return channel.makefile("rb"), channel.makefile_stderr("rb")

    def run_with_input(self, argv: Sequence[str], data: bytes) -> CommandResult:
        """Run a command with `data` on its standard input and return what it printed: for values that
        must appear neither in a command line (the head node's `ps`) nor in a file (a job's secrets)."""
        result: list[CommandResult] = []
        with self.command_input(argv, result=result) as stdin:
            stdin.write(data)
        return result[0]

    @contextmanager
    def command_input(self, argv: Sequence[str], result: list[CommandResult] | None = None) -> Iterator[IO[bytes]]:
        """Run a command that reads what the caller writes to it (e.g. `tar -x`), in one round trip
        for any amount of data; fails when the command does. Each write waits at most
        command_timeout for the head node to take more. `result` receives the command's result."""
        argv = tuple(self._slurm_argv(argv))
        client = self.get_conn()
        with self._deadline(client, self.command_timeout, f"`{shlex.join(argv)[:200]}`"):
            stdin, stdout, stderr = client.exec_command(quote_command(argv), timeout=self.command_timeout)
        try:
            yield stdin
            stdin.flush()
            stdin.channel.shutdown_write()
            with self._deadline(client, self.command_timeout, f"the end of `{shlex.join(argv)[:200]}`"):
                out = bounded_read(stdout, MAX_ERROR_BYTES)  # sbatch's job id, tar's complaints: a line or two
                err = bounded_read(stderr, MAX_ERROR_BYTES)
                code = stdout.channel.recv_exit_status()
        except TimeoutError as exc:
            self.close()
            raise SlurmConnectionError(self._stalled(f"`{shlex.join(argv)[:200]}`", self.command_timeout)) from exc
        except BaseException:
            stdin.channel.close()  # the command sees its input cut short and fails; nothing half-done is kept
            raise
        done = CommandResult(argv, code, out, err).check()
        if result is not None:
            result.append(done)

    @contextmanager
    def command_output(self, argv: Sequence[str]) -> Iterator[IO[bytes]]:
        """Run a command whose output the caller reads as a stream (e.g. `tar -c`): SSH's flow control
        keeps at most one channel window in memory, whatever the size. Fails when the command does
        (after the caller has read what it wanted); each read waits at most command_timeout."""
        argv = tuple(self._slurm_argv(argv))
        client = self.get_conn()
        with self._deadline(client, self.command_timeout, f"`{shlex.join(argv)[:200]}`"):
            stdin, stdout, stderr = client.exec_command(quote_command(argv), timeout=self.command_timeout)
        stdin.channel.shutdown_write()
        try:
            yield stdout
            with self._deadline(client, self.command_timeout, f"the end of `{shlex.join(argv)[:200]}`"):
                while stdout.read(1 << 20):  # what the caller left unread, dropped a chunk at a time
                    pass
                err = bounded_read(stderr, MAX_ERROR_BYTES)
                code = stdout.channel.recv_exit_status()
        except TimeoutError as exc:
            self.close()
            raise SlurmConnectionError(self._stalled(f"`{shlex.join(argv)[:200]}`", self.command_timeout)) from exc
        except BaseException:
            stdout.channel.close()
            raise
        CommandResult(argv, code, "", err).check()

    def file_sizes(self, directory: str) -> dict[str, int]:
        """Size of every file under `directory` by relative path, in one command (empty if it is absent)."""
        result = self.run(["find", directory, "-type", "f", "-printf", "%s %P\\0"], check=False)
        sizes = {}
        for record in result.stdout.split("\0"):
            size, _, rel = record.partition(" ")
            if size.isdigit() and rel:
                sizes[rel] = int(size)
        return sizes

    def makedirs(self, *paths: str) -> None:
        """`mkdir -p` on the head node: directories other tasks and users may share (a run's own use
        `make_private_dirs`)."""
        self.run(["mkdir", "-p", "--", *paths])

    def make_private_dirs(self, *paths: str) -> None:
        """Directories only the SSH user can enter (0700), also when they existed already: a run's
        directory holds its environment and outputs. Fails on a directory another user owns."""
        script = 'mkdir -p -m 700 -- "$@" && chmod 700 -- "$@"'  # values travel as positional parameters
        self.run(["sh", "-c", script, "sh", *paths])

    def make_run_dirs(self, run: str, *jobs: str) -> None:
        """A run's directory and its jobs' directories (`make_job_dirs`). Without a job user, private to the
        SSH user (0700); with one, the run's directory is in its group, 2750: its jobs enter, never write."""
        if not self.job_user:
            self.make_private_dirs(run, *jobs)
            return
        self._make_group_dirs("2750", run)
        if jobs:
            self.make_job_dirs(*jobs)

    def make_job_dirs(self, *paths: str) -> None:
        """Directories a job writes in. Without a job user, private to the SSH user (0700). With one, in its
        group, 3770: setgid (what the SSH user writes there, the job reads) and sticky (the job writes its
        own files but cannot remove or replace the SSH user's: its script, hyperparameters, `submitted`,
        pcflow's decisions). Also when they existed already; fails on a directory another user owns."""
        if not self.job_user:
            self.make_private_dirs(*paths)
            return
        self._make_group_dirs("3770", *paths)

    def make_job_logs(self, *paths: str) -> None:
        """Job logs the SSH user owns before the job starts (0660, the job directory's group): Slurm opens
        one as the job account to append to, and the sticky directory keeps the job from replacing it
        with a link to a file only the SSH user may read, which pcflow would stream into the task log.
        One left by an earlier attempt is kept (log offsets count on it); anything else there is removed
        first, and a name that reappears meanwhile fails this (noclobber), before anything is submitted."""
        if not self.job_user:
            return  # the job is the SSH user: nothing it can link to that it could not read itself
        script = (
            'for f; do if [ -L "$f" ] || { [ -e "$f" ] && [ ! -O "$f" ]; }; then rm -f -- "$f"; fi; '
            '[ -e "$f" ] || (set -C; umask 007; : > "$f"); done'
        )
        self.run(["sh", "-c", script, "sh", *paths])

    def _make_group_dirs(self, mode: str, *paths: str) -> None:
        """Made private first (0700), then given to the job account's group with `mode`: never open wider
        than that, not even for a moment."""
        script = 'g=$1; m=$2; shift 2; mkdir -p -m 700 -- "$@" && chgrp -- "$g" "$@" && chmod "$m" -- "$@"'
        self.run(["sh", "-c", script, "sh", str(self.job_user), mode, *paths])

    def write_file(self, path: str, data: bytes | str, *, mode: int = 0o600) -> None:
        """Write through a temporary name and rename, so a reader never sees half a file; the mode is
        set before any byte is written (private by default)."""
        payload = data.encode() if isinstance(data, str) else data
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        try:
            with self._sftp_request(f"the write of {path}") as sftp:
                with sftp.open(tmp, "wbx") as fh:  # a new file: never one a job planted under this name
                    fh.chmod(mode)
                    fh.write(payload)
                sftp.posix_rename(tmp, path)
        except OSError as exc:
            self._remove_quietly(tmp)
            hint = " The cluster's disk may be full." if "space" in str(exc).lower() or exc.errno == 28 else ""
            raise SlurmError(f"Could not write {path} on the head node: {exc}.{hint}") from exc

    def _remove_quietly(self, path: str) -> None:
        try:
            self.sftp.remove(path)
        except OSError:
            pass

    def file_size(self, path: str) -> int | None:
        """The size of a remote file in bytes, None when it does not exist (yet): how a log's offset is taken
        before submitting."""
        try:
            with self._sftp_request(f"a stat of {path}") as sftp:
                return sftp.stat(path).st_size
        except FileNotFoundError:
            return None

    def read_file(self, path: str, offset: int = 0, max_bytes: int = MAX_READ_BYTES) -> bytes:
        """At most `max_bytes` of a remote file from `offset` (jobs write these files: no read is
        unbounded); empty when the file does not exist (yet), or is not a regular file pcflow may read
        (a link a job made there is never followed: `pcflow.slurm.jobfiles`, said in the log)."""
        try:
            with self._sftp_request(f"the read of {path}") as sftp:
                named = sftp_status(sftp.lstat(path))
                jobfiles.check_named(path, named)
                with sftp.open(path, "rb") as fh:
                    opened = fh.stat()
                    jobfiles.check_opened(path, named, sftp_status(opened))
                    return self._read_open(fh, offset, max_bytes, opened.st_size or 0)
        except jobfiles.NotAJobFile as exc:
            jobfiles.refused(exc)
            return b""
        except FileNotFoundError:
            return b""

    @staticmethod
    def _read_open(fh: Any, offset: int, max_bytes: int, size: int) -> bytes:
        end = offset + max(0, min(max_bytes, size - offset))
        # readv pipelines the 32 KiB requests; pieces of 1 MiB, as paramiko's read grows its result by
        # concatenation (quadratic: one 32 MiB read took 40 s of CPU).
        pieces = [(at, min(READ_PIECE_BYTES, end - at)) for at in range(offset, end, READ_PIECE_BYTES)]
        return b"".join(fh.readv(pieces))

    def read_json(self, path: str) -> dict | None:
        """A small JSON object (an exit marker, early_stop.json); None when absent, large or anything else."""
        return json_object(self.read_file(path, 0, SMALL_FILE_BYTES + 1))

    def is_dir(self, path: str) -> bool:
        """Whether a remote path is a directory; False when it is absent (how a shipped payload is found already
        there)."""
        try:
            with self._sftp_request(f"a stat of {path}") as sftp:
                return stat.S_ISDIR(sftp.stat(path).st_mode or 0)
        except FileNotFoundError:
            return False

    # -- Slurm ---------------------------------------------------------------------------------

    def _stdout(self, argv: list[str]) -> str:
        return self.run(argv, check=False).stdout

    @cached_property
    def accounting_enabled(self) -> bool:
        return queries.drive(queries.accounting_enabled(), self._stdout)

    def submit(
        self,
        script_path: str,
        *,
        submitted_marker: str | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> str:
        """`sbatch --parsable`; the job id is also written to `submitted_marker` on the head node,
        in the same remote command, so a worker that dies right after sbatch still leaves it behind.

        `env` reaches the job through sbatch's environment (Slurm keeps it with the job, requeues
        included), sent on the command's standard input as NUL-separated `NAME=value` pairs: never in
        the batch script, which the shared file system may export to S3, nor in a command line."""
        sbatch = self._slurm_argv(["sbatch", "--parsable", *args, script_path])
        if env:  # exported by the shell that runs sbatch: after sudo, whose filter would drop PYTHONPATH & co.
            sbatch = ["bash", "-c", EXPORT_INPUT_PAIRS, "bash", *sbatch]
        # Positional parameters carry every value: the shell text itself is constant. As the job user, PATH
        # travels as a value (sudo's secure_path lacks the site's Slurm directory, which the job's srun needs).
        as_user = f'set -- {" ".join(SUDO_AS)} "$J" -- env PATH="$PATH" "$@"; ' if self.job_user else ""
        # (through mktemp: a fixed temporary name in a directory the job writes could be its link)
        record = 't=$(mktemp "$M.XXXXXX"); printf %s "$id" > "$t"; mv -f "$t" "$M"; ' if submitted_marker else ""
        script = f'set -e; {as_user}out=$("$@"); id=${{out%%;*}}; {record}echo "$id"'
        values = [f"M={submitted_marker}"] if submitted_marker else []
        values += [f"J={self.job_user}"] if self.job_user else []
        argv = ["env", *values, "sh", "-c", script, "sh", *sbatch]
        if env:
            pairs = b"".join(f"{name}={value}".encode() + b"\0" for name, value in env.items())
            out = self.run_with_input(argv, pairs).stdout
        else:
            out = self.run(argv).stdout
        job_id = out.strip().split(";")[0].strip()
        if not job_id.isdigit():
            raise SlurmError(f"sbatch did not return a job id (got {out.strip()!r})")
        return job_id

    def job_info(self, job_id: str) -> JobInfo | None:
        """Slurm's word on one job now, None when no source knows it any more (the exit marker may still: the
        operator asks it next)."""
        return queries.drive(queries.job_info(job_id, self.accounting_enabled), self._stdout)

    def array_elements(self, array_id: str) -> list[JobInfo]:
        """One JobInfo per element of a job array that Slurm still knows, ordered by index; empty when it knows none."""
        return queries.drive(queries.array_elements(array_id, self.accounting_enabled), self._stdout)

    def find_jobs(self, job_name: str) -> list[JobInfo]:
        """Jobs with this exact name, live and (with accounting) finished; oldest first."""
        return queries.drive(queries.jobs_named(job_name, self.accounting_enabled), self._stdout)

    def cancel(self, job_id: str, *, signal: str | None = None) -> None:
        """`scancel`, never failing: a job already gone is what the caller wanted. `signal` sends it instead of
        ending the job."""
        argv = ["scancel", *(["--signal", signal] if signal else []), job_id]
        self.run(as_job_user(argv, self.job_user), check=False)

    def requeue(self, job_id: str) -> None:
        """`scontrol requeue`: Slurm runs the job again under the same id (the operator's waits treat that as
        progress, not failure)."""
        self.run(as_job_user(["scontrol", "requeue", job_id], self.job_user))
