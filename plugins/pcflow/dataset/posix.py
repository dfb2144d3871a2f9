"""The POSIX metadata FSx for Lustre gives what it imports, written on each object pcflow loads.

FSx imports an S3 object's `x-amz-meta-file-permissions` (`<octal file type><octal mask>`, as st_mode),
`x-amz-meta-file-owner` and `x-amz-meta-file-group` (numbers), and a key ending in `/` as a directory
with its own (the FSx for Lustre guide, "POSIX metadata support for data repositories"). Without them an
imported file or directory belongs to root and every user reads it, so every job on a cluster would read
every partition under the linked prefix. With them, each file belongs to the cluster's SSH user (0644:
readable through a directory that lets one in), and the partition's directory is the SSH user's alone
(0700): a job reads its partition only through its run's view (hard links the SSH user makes in the run's
directory, which only the run's job account enters; owning the files is what lets the SSH user link them
where the kernel protects hard links). A profile that sets no owner (`dataset.fsx_owner`) writes none.
"""

from __future__ import annotations

from typing import NamedTuple

#: A regular file, rw-r--r--, and a directory, rwx------ (st_mode in octal, as FSx writes it).
FILE_MODE = "0100644"
DIRECTORY_MODE = "040700"


class FsxOwner(NamedTuple):
    """The uid and gid FSx gives what pcflow loads: the cluster's SSH user's (an admin's setting)."""

    uid: int
    gid: int

    def tag(self) -> str:
        """`uid:gid`, recorded with each manifest entry: an entry loaded under another owner is loaded again."""
        return f"{self.uid}:{self.gid}"


def object_metadata(owner: FsxOwner | None) -> dict[str, str]:
    """The user metadata of a file's object (boto3 adds the `x-amz-meta-` prefix); none without an owner."""
    if owner is None:
        return {}
    return {"file-permissions": FILE_MODE, "file-owner": str(owner.uid), "file-group": str(owner.gid)}


def directory_metadata(owner: FsxOwner) -> dict[str, str]:
    """The user metadata of the partition's directory object (its key ends in `/`)."""
    return {**object_metadata(owner), "file-permissions": DIRECTORY_MODE}
