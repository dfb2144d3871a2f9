"""A directory tree as one deterministic archive named by its content: the bundle a run's code (and an
admin's payload) travels in.

The same files give the same bytes, whoever packs them and wherever: entries sorted by name, every time,
owner and group zero, modes 0644 or 0755 (executable kept), directories included, nothing else. Its id is
the sha256 of the archive, so it names the code exactly and a re-run finds it where it was moved before.

What goes in is decided by one filter (`TreeFilter`), the same on every path that packs a tree: the
defaults (`DEFAULT_EXCLUDES`; any directory holding `pyvenv.cfg`, which is a virtualenv whatever its
name) and the tree's own `.gitignore` and `.pcflowignore` at its top (gitwildmatch, read with
`pathspec`; a `!pattern` in `.pcflowignore` brings back what the others excluded). A symbolic link or
anything but a plain file or directory is refused: it would point out of the tree. A bundle over the
admin's size cap is refused naming its largest files, and one holding what looks like a secret
(`pcflow.secretscan`) is refused unless the admin allows it, naming the files and never their content.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

from pcflow.checksums import checksum_list, sha256_hex
from pcflow.errors import ConfigurationError
from pcflow.secretscan import secrets_summary

DIGEST_LEN = 20
#: What no bundle carries, whatever the tree's ignore files say (gitwildmatch patterns): version control,
#: caches, virtualenvs by their usual names, environment files, checkpoints and model weights a run writes.
DEFAULT_EXCLUDES = (
    ".git/",
    ".hg/",
    ".svn/",
    "__pycache__/",
    "*.py[cod]",
    ".pytest_cache/",
    ".mypy_cache/",
    ".ruff_cache/",
    ".ipynb_checkpoints/",
    ".venv/",
    "venv/",
    "node_modules/",
    ".env",
    ".env.*",
    ".envrc",
    "checkpoints/",
    "*.ckpt",
    ".DS_Store",
)
IGNORE_FILES = (".gitignore", ".pcflowignore")
#: A directory holding this file is a virtualenv (PEP 405), whatever it is called: never shipped.
VENV_MARKER = "pyvenv.cfg"
#: Names this packing (format and filter): a record of what a commit packed to holds for the same one only.
PACKING = hashlib.sha256(json.dumps(["pax-v1", DEFAULT_EXCLUDES, IGNORE_FILES, VENV_MARKER]).encode()).hexdigest()[:16]
LARGEST_SHOWN = 5


class BundleRefused(ConfigurationError):
    """The tree cannot be shipped as it is (a link, too large, a secret); the message says what to change."""


@dataclass(frozen=True)
class Bundle:
    """A packed tree: the archive's bytes, its id (the directory it is staged in), what it holds."""

    name: str
    data: bytes  # an uncompressed tar: code is small and the transports compress nothing twice
    digest: str
    files: int
    checksums: bytes  # every file's sha256, as `sha256sum` lists them (pcflow.checksums)
    content_bytes: int = 0
    sha256: str = field(default="", repr=False)  # the whole archive's, for S3's ChecksumSHA256


class TreeFilter:
    """Which paths of a tree a bundle holds: the defaults, then the tree's `.gitignore` and `.pcflowignore`,
    the last match deciding (as git does). One object for one tree, asked for every path."""

    def __init__(self, root: Path, extra: tuple[str, ...] = ()) -> None:
        lines = [*DEFAULT_EXCLUDES, *extra]
        for name in IGNORE_FILES:
            ignore = root / name
            if ignore.is_file() and not ignore.is_symlink():
                lines += ignore.read_text(errors="replace").splitlines()
        self.root, self.spec = root, pathspec.GitIgnoreSpec.from_lines(lines)

    def excluded(self, relative: str, *, is_dir: bool) -> bool:
        """Whether the path (relative, POSIX) stays out of the bundle."""
        return self.spec.match_file(f"{relative}/" if is_dir else relative)

    def members(self) -> Iterator[tuple[Path, str]]:
        """Every (path, relative name) the bundle holds, sorted; an excluded directory is not entered.
        A link, or anything but a file or directory, is refused (BundleRefused)."""
        for top, dirs, files in os.walk(self.root, followlinks=False):
            base = Path(top)
            entries = [(name, True) for name in dirs] + [(name, False) for name in files]
            kept_dirs = []
            for name, _ in sorted(entries):
                path = base / name
                relative = path.relative_to(self.root).as_posix()
                is_dir = path.is_dir() and not path.is_symlink()
                if self.excluded(relative, is_dir=is_dir) or (is_dir and (path / VENV_MARKER).exists()):
                    continue
                if path.is_symlink() or not (is_dir or path.is_file()):
                    raise BundleRefused(
                        f"{relative} is not a plain file or directory (a link or a special file); ship real files "
                        "or list it in .pcflowignore"
                    )
                if is_dir:
                    kept_dirs.append(name)
                yield path, relative
            dirs[:] = sorted(kept_dirs)


def pack(root: Path, *, name: str, max_bytes: int, allow_secrets: bool = False) -> Bundle:
    """The tree's deterministic archive and id (see the module's docstring): refused over `max_bytes` of file
    content (naming the largest files) or holding a secret unless `allow_secrets`."""
    if not root.is_dir():
        raise BundleRefused(f"{root} is not a directory")
    members = sorted(TreeFilter(root).members(), key=lambda member: member[1].encode())
    _refuse_oversize(members, max_bytes)
    if not allow_secrets and (found := secrets_summary(members)):
        raise BundleRefused(
            f"the code holds what looks like a secret: {found}. Remove it from the tree or list it in "
            ".pcflowignore (a job gets secrets through training.env's references); only the deployment admin "
            "may ship it anyway (training.bundle.allow_secrets)"
        )
    buffer, total, hashes = io.BytesIO(), 0, {}
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, relative in members:
            info = tarfile.TarInfo(relative)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if path.is_dir():
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
                continue
            data = path.read_bytes()
            total += len(data)
            info.size, info.mode = len(data), 0o755 if path.stat().st_mode & 0o111 else 0o644
            tar.addfile(info, io.BytesIO(data))
            hashes[relative] = sha256_hex(data)
    data = buffer.getvalue()
    try:
        checksums = checksum_list(hashes)
    except ValueError as exc:
        raise BundleRefused(f"{exc}; rename the file") from None
    whole = hashlib.sha256(data).hexdigest()
    return Bundle(name, data, whole[:DIGEST_LEN], len(hashes), checksums, total, whole)


def _refuse_oversize(members: list[tuple[Path, str]], max_bytes: int) -> None:
    """Refuse a tree whose files add up to more than the cap, naming the largest (what to ignore first)."""
    sizes = [(path.stat().st_size, relative) for path, relative in members if path.is_file()]
    total = sum(size for size, _ in sizes)
    if total <= max_bytes:
        return
    largest = ", ".join(f"{relative} ({_mib(size)})" for size, relative in sorted(sizes, reverse=True)[:LARGEST_SHOWN])
    raise BundleRefused(
        f"the code is {_mib(total)}, over the {_mib(max_bytes)} cap (training.bundle.max_mib, the admin's); "
        f"largest files: {largest}. Keep data and weights out of the code (list them in .pcflowignore; the "
        "dataset stage carries data)"
    )


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"
