"""SHA-256 lists in `sha256sum`'s own format, and streams hashed as they are read.

One format for everything pcflow checks by hash: the code it stages (`pcflow.slurm.payload`: the archive
knows each file's hash, the cluster's copy is checked against it), the environments jobs run in (their
record, written where they are built by include/ami/tree-record.sh, checked by `pcflow.slurm.trees`)
and the artifacts a run keeps (`pcflow.metrics.outputs` hashes them on the cluster, `pcflow.artifacts`
refuses a download that does not match). A list is what `sha256sum` prints and `sha256sum --check`
reads: one `<64 hex digits>  <path>` line per file, sorted by path as bytes. A name sha256sum would
escape (a backslash, a newline or a carriage return in it) is refused: nothing pcflow hashes needs one,
and an escaped line would read as another file's.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Mapping
from typing import IO

from pcflow.errors import PcflowError

SHA256_HEX = re.compile(r"[0-9a-f]{64}")
#: The S3 object's user metadata holding the file's sha256 (hex), as it was computed before the copy: the
#: run's outputs (`pcflow.metrics.outputs`) and the code bundles (`pcflow.code.upload`) skip an upload whose
#: object already holds it.
SHA256_KEY = "pcflow-sha256"
#: A line of `sha256sum` output: text mode (two spaces) or binary mode (` *`).
LINE = re.compile(r"([0-9a-f]{64}) [ *](.+)")
ODD_NAME = re.compile(r"[\\\n\r]")


class ChecksumMismatch(PcflowError):
    """Bytes are not the ones a hash was recorded for; the message names both hashes and what to do."""


def sha256_hex(data: bytes) -> str:
    """The hash every record in pcflow uses (sha256sum's spelling), so lists compare as text."""
    return hashlib.sha256(data).hexdigest()


def s3_checksum(hex_digest: str) -> str:
    """The same hash as S3's `ChecksumSHA256` spells it (base64 of the 32 bytes)."""
    return base64.b64encode(bytes.fromhex(hex_digest)).decode()


def checked_name(path: str) -> str:
    """A path a checksum list may name: relative, inside its tree, and one line (sha256sum escapes \\, CR, LF)."""
    if not path or path.startswith("/") or ODD_NAME.search(path) or ".." in path.split("/"):
        raise ValueError(f"{path!r} cannot be named in a checksum list (a relative path without \\, CR or LF)")
    return path


def checksum_list(entries: Mapping[str, str]) -> bytes:
    """`sha256sum`'s output for these files (path -> hex digest), sorted as `sort` in the C locale does."""
    lines = []
    for path in sorted(entries, key=lambda p: p.encode()):
        digest = entries[path]
        if not SHA256_HEX.fullmatch(digest):
            raise ValueError(f"{path}: {digest!r} is not a sha256 hex digest")
        lines.append(f"{digest}  {checked_name(path)}\n")
    return "".join(lines).encode()


def parse_checksum_list(text: str, *, max_entries: int = 1_000_000) -> dict[str, str]:
    """path -> hex digest from `sha256sum` output; a line that is not one (an escaped name, an error, too
    many lines) is refused rather than skipped: a list that does not parse proves nothing."""
    entries: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        match = LINE.fullmatch(line)
        if match is None or number > max_entries:
            raise ValueError(f"line {number} of a checksum list is not `<sha256>  <path>`: {line[:200]!r}")
        entries[checked_name(match[2])] = match[1]
    return entries


class HashingReader:
    """A file object that hashes and counts what it hands on, and checks the hash the moment the expected
    size has been read: an upload whose last part would complete it, or a download about to be renamed
    into place, stops there instead of keeping bytes that are not the recorded ones."""

    def __init__(self, source: IO[bytes], *, size: int, sha256: str, what: str) -> None:
        self.source, self.size, self.expected, self.what = source, size, sha256, what
        self.count, self.digest = 0, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        """The next bytes, hashed as they pass; past the recorded size or at a wrong last byte, refused."""
        data = self.source.read(size)
        self.count += len(data)
        self.digest.update(data)
        if self.count > self.size:
            raise ChecksumMismatch(f"{self.what}: more than the {self.size} bytes recorded; not kept")
        if self.count == self.size and data:
            self.check()
        return data

    def check(self) -> None:
        """Fails unless exactly the recorded bytes went through."""
        found = self.digest.hexdigest()
        if self.count != self.size or found != self.expected:
            raise ChecksumMismatch(
                f"{self.what}: {self.count} bytes with sha256 {found}, but {self.size} bytes with sha256 "
                f"{self.expected} were recorded: the bytes changed after they were hashed; not kept"
            )
