"""Check a directory on the cluster against sha256 records: staged code against the archive it came from,
an environment against the record written when it was built.

The checks are include/ami/tree-record.sh, the script that also writes the records, sent over SSH with
every check (never a copy on the cluster, which a job could have changed) and run in one command. Its
output is a bounded list of findings, `<kind> <path>`; an output line this module does not know counts
as a finding too, so a check that did not run as written never passes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from pcflow.checksums import SHA256_HEX

if TYPE_CHECKING:
    from pcflow.slurm.hook import SlurmHook

#: What tree-record.sh reports, and what each kind means in a message.
FINDINGS = {
    "absent": "does not exist",
    "no-record": "has no integrity record",
    "bad-record": "does not match its own marker (files.sha256 or links changed)",
    "owner": "is owned by a user other than root or pcflow's",
    "writable": "is writable by group or others",
    "special": "is not a regular file or directory",
    "missing": "is missing",
    "extra": "was not there when the record was made",
    "changed": "does not have its recorded sha256",
    "link": "is a link that was not recorded so",
}
SHOWN_FINDINGS = 8
EPOCH = re.compile(r"\d{1,12}(\.\d{1,9})?")


@cache
def tree_record_script() -> str:
    """The record/check script from include/: it travels with every check, so no copy on the cluster is trusted."""
    from pcflow.paths import ami_script

    return ami_script("ami/tree-record.sh").read_text()


@dataclass(frozen=True)
class TreeCheck:
    """One check's answer: what is wrong (nothing: it matches), and for an environment its record."""

    directory: str
    findings: tuple[str, ...]
    record: str | None = None
    full: bool = False
    started: str | None = None

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def absent(self) -> bool:
        return self.findings == ("absent .",)

    def summary(self) -> str:
        """The first findings in words, e.g. `lib/x.py does not have its recorded sha256`."""
        shown = []
        for finding in self.findings[:SHOWN_FINDINGS]:
            kind, _, path = finding.partition(" ")
            shown.append(f"{path} {FINDINGS[kind]}" if kind in FINDINGS else f"unexpected output {finding!r}")
        more = len(self.findings) - SHOWN_FINDINGS
        return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


def parse_check(directory: str, stdout: str) -> TreeCheck:
    """The check's output as findings; a line the script never writes fails the check rather than being ignored."""
    findings, meta = [], {}
    for line in stdout.splitlines():
        kind, _, rest = line.partition(" ")
        if (kind == "record" and SHA256_HEX.fullmatch(rest)) or (kind == "started" and EPOCH.fullmatch(rest)):
            meta[kind] = rest
        elif line == "full":
            meta["full"] = "yes"
        elif line:
            findings.append(line)
    return TreeCheck(directory, tuple(findings), meta.get("record"), "full" in meta, meta.get("started"))


def compare_tree(hook: SlurmHook, directory: str, checksums: bytes) -> TreeCheck:
    """`directory` against a sha256sum list (`pcflow.checksums.checksum_list`): exactly those files, with
    those hashes, nothing else, nothing another user could change. One command."""
    argv = ["bash", "-c", tree_record_script(), "tree-record", "compare", directory]
    return parse_check(directory, hook.run_with_input(argv, checksums).stdout)


def check_tree(hook: SlurmHook, directory: str, *, state: str, timeout: float) -> TreeCheck:
    """`directory` against its own record; in full (every file hashed) unless `state` says this record
    was verified in full and nothing in the tree changed since. One command, `timeout` at most."""
    argv = ["bash", "-c", tree_record_script(), "tree-record", "check", directory, state]
    return parse_check(directory, hook.run(argv, timeout=timeout).stdout)
