"""What in a tree looks like a secret, so a bundle never carries one unless the admin allows it: files by
their name (`.aws/credentials`, `.netrc`, SSH private keys) and by what they hold (a private key's PEM
header, an AWS access key id, GitHub and Hugging Face tokens). The refusal names the files and the kind
of secret, never the matched text (it would land in the task log)."""

from __future__ import annotations

import re
from pathlib import Path

#: (kind, pattern) over a file's bytes.
CONTENT = (
    ("a private key", re.compile(rb"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")),
    ("an AWS access key id", re.compile(rb"(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])")),
    ("a GitHub token", re.compile(rb"(?<![A-Za-z0-9_])(?:gh[pousr]_[A-Za-z0-9]{36}|github_pat_[A-Za-z0-9_]{60,})")),
    ("a Hugging Face token", re.compile(rb"(?<![A-Za-z0-9_])hf_[A-Za-z0-9]{30,}")),
)
#: (kind, pattern) over a path relative to the tree's top.
NAMES = (
    ("AWS credentials", re.compile(r"(^|/)\.aws/(credentials|config)$")),
    ("a .netrc", re.compile(r"(^|/)[._]netrc$")),
    ("an SSH private key", re.compile(r"(^|/)id_(rsa|dsa|ecdsa|ed25519)(_sk)?$")),
    ("a Git credential store", re.compile(r"(^|/)\.git-credentials$")),
)
SHOWN = 10


def findings(members: list[tuple[Path, str]]) -> list[str]:
    """`<path>: <kind>` for each file that looks like it holds a secret."""
    found = []
    for path, relative in members:
        if not path.is_file():
            continue
        kinds = [kind for kind, pattern in NAMES if pattern.search(relative)]
        data = path.read_bytes()
        kinds += [kind for kind, pattern in CONTENT if pattern.search(data)]
        found += [f"{relative}: {kind}" for kind in dict.fromkeys(kinds)]
    return found


def secrets_summary(members: list[tuple[Path, str]]) -> str | None:
    """The files that look like they hold a secret, in one line for a refusal (None: none do)."""
    found = findings(members)
    if not found:
        return None
    more = f"; and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
    return "; ".join(found[:SHOWN]) + more
