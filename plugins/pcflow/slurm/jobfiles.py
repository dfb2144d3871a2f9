"""Reading a file in a job's directory without following a link the job put there.

pcflow reads what a job makes (its metrics, utilisation samples, exit markers, the array's `done` list)
and its own files beside them (`submitted`, `early_stop.json`, `budget_exhausted.json`) over SFTP, as the
SSH user, who may read what the job account may not: the SSH user's keys, the staged partitions of
other runs, another run's closed directory. SFTP (version 3, what OpenSSH's sftp-server speaks) has no
O_NOFOLLOW, so a link the job made under a name pcflow reads would be followed with the SSH user's
rights, and the target parsed as the job's metrics or marker.

So each such read takes the name's own status first (`lstat`, which does not follow a link) and reads
only a regular file; then it compares that status with the status of the file it opened (`fstat` of
the open handle): owner, group, type and permission bits must be the same, so a name the job swapped
for a link between the two is not read either. A hard link gives the job nothing: the kernel lets it
link only files it owns or may read and write (`fs.protected_hardlinks`, on by default), and none in a
directory it cannot enter. What is left: during a running job, a swap to a link to a file with the same
owner, group and mode as the one it replaced, that is an earlier run's file of the same job account in a
closed run directory, won between the two calls (docs/security.md).
"""

from __future__ import annotations

import logging
import stat
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Status:
    """What the check compares of a file's status: st_mode (type and permission bits), owner, group."""

    mode: int
    uid: int | None
    gid: int | None


class NotAJobFile(OSError):
    """A name in a job's directory that pcflow does not read: a link, a FIFO, a directory, or a file
    swapped while it was opened. Readers treat it as absent, after saying why in the log."""


def check_named(path: str, named: Status) -> None:
    """Refuse a name that is not a regular file (its own status, from `lstat`): a link is never followed."""
    if stat.S_ISLNK(named.mode):
        raise NotAJobFile(f"{path} is a link: pcflow does not read what it points to (a job may have made it)")
    if not stat.S_ISREG(named.mode):
        raise NotAJobFile(f"{path} is not a regular file: pcflow does not read it")


def check_opened(path: str, named: Status, opened: Status) -> None:
    """Refuse the file opened under `path` unless it is the one its name's status described."""
    if named != opened:
        raise NotAJobFile(
            f"{path} changed between its status and its opening (a link swapped in?): pcflow does not read it"
        )


def refused(error: NotAJobFile) -> None:
    """Say in the log why a file was not read (its reader goes on as if it were absent)."""
    log.warning("%s", error)
