"""Stat many files on the head node every poll through one long-lived process.

A command per poll starts the user's login shell each time (sshd runs every command through it), and a
shell's start-up can cost far more than the stat: on this project's own machine root's ~/.bashrc runs
`pyenv init`, half a second per command. So a session starts one small loop when it connects and
keeps it: each poll writes `<byte count>\\n` and that many bytes of NUL-separated paths (data, never
shell text); the loop reads exactly those bytes (`head -c` does not read ahead on a pipe), stats them
in one `stat`, and ends its answer with TERMINATOR. It ends with the connection (its stdin closes).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import asyncssh

from pcflow.slurm.hook import quote_command

LOOP = (
    'while read -r n; do head -c "$n" | xargs -0 -r stat --printf "%s %i %n\\0" -- 2>/dev/null; '
    'printf "\\0END\\0"; done'
)
#: A stat record starts with a digit, so a record that is exactly END cannot be a file's.
TERMINATOR = b"\0END\0"


class StatLoopLost(ConnectionError):
    """The stat loop ended or did not answer in time: its connection is not to be trusted any more."""


@dataclass(frozen=True)
class FileStat:
    """Size and inode: a marker rewritten through a temporary file and a rename gets a new inode."""

    size: int
    inode: int


class StatLoop:
    """The head node's end of the session's per-poll stat."""

    def __init__(self, process: asyncssh.SSHClientProcess) -> None:
        self.process = process

    @classmethod
    async def start(cls, conn: asyncssh.SSHClientConnection) -> StatLoop:
        """Start the loop on the head node over `conn`: once per connection, so no poll pays for a login shell."""
        process = await conn.create_process(quote_command(["sh", "-c", LOOP]), encoding=None, stderr=asyncssh.DEVNULL)
        return cls(process)

    async def stat(self, paths: list[str], timeout: float) -> dict[str, FileStat]:
        """Size and inode of each path that exists. A late or missing answer raises StatLoopLost: it must
        never be read as the answer to the next question."""
        data = ("\0".join(paths) + "\0").encode()
        self.process.stdin.write(b"%d\n" % len(data) + data)
        try:
            answer = await asyncio.wait_for(self.process.stdout.readuntil(TERMINATOR), timeout)
        except (asyncio.IncompleteReadError, TimeoutError) as exc:
            raise StatLoopLost(f"the head node's stat loop did not answer within {timeout:.0f} s") from exc
        return parse_stats(answer[: -len(TERMINATOR)].decode(errors="replace"))

    def close(self) -> None:
        """Stop the loop: closing its stdin ends it on the head node."""
        self.process.close()


def parse_stats(output: str) -> dict[str, FileStat]:
    """`<size> <inode> <path>\\0` records (a path may hold spaces) -> {path: FileStat}."""
    files = {}
    for record in output.split("\0"):
        size, _, rest = record.partition(" ")
        inode, _, path = rest.partition(" ")
        if size.isdigit() and inode.isdigit() and path:
            files[path] = FileStat(int(size), int(inode))
    return files
