"""Where a run's code comes from, read into a directory on this worker: a git commit, a directory the
profile allows, or a tar in S3.

A git source names a repository and a ref; the first task (`validate`) asks the repository once which
commit the ref is (`resolve_commit`) and records it in the run document, so every later task, retry
and backfill fetches exactly that commit (`fetch_commit`: one commit, no history, into a temporary
directory), whatever the branch does meanwhile. A private repository is reached through an Airflow
connection (`conn_id`: the git provider's GitHook, its key or token never in a URL, a log or XCom).
A directory is read where it is; when it is a git checkout, its commit and whether it differs from it
(`dirty`, ignored files aside) are recorded. An S3 bundle is downloaded (bounded by the size cap) and
unpacked with tarfile's `data` filter, then packed again like any tree, so its id hashes what it holds.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pcflow.bundles import BundleRefused
from pcflow.errors import PcflowError
from pcflow.patterns import COMMIT, check_git_url, check_ref

GIT_TIMEOUT_S = 600
#: Protocols git may use at all (no `ext::`, which runs a command; no plain http or git://).
ALLOWED_PROTOCOLS = "file:https:ssh"


class SourceFailed(PcflowError):
    """The repository or bucket did not answer as expected (network, server): retried."""


@dataclass(frozen=True)
class Fetched:
    """A source read into a directory: the tree to pack and what the provenance says of it."""

    tree: Path
    source: str
    url: str | None = None
    commit: str | None = None
    dirty: bool | None = None


@contextlib.contextmanager
def git_env(url: str, conn_id: str | None) -> Iterator[tuple[str, dict[str, str]]]:
    """The URL and environment git runs with: the connection's key or token (GitHook) when `conn_id` names
    one, prompts off, only ALLOWED_PROTOCOLS."""
    base = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ALLOW_PROTOCOL": ALLOWED_PROTOCOLS}
    if not conn_id:
        yield url, base
        return
    from airflow.providers.git.hooks.git import GitHook

    hook = GitHook(git_conn_id=conn_id, repo_url=url)
    with hook.configure_hook_env():
        yield url, {**base, **os.environ, **hook.env, "GIT_ALLOW_PROTOCOL": ALLOWED_PROTOCOLS}


def git(
    args: list[str], env: dict[str, str], cwd: Path | None = None, *, text: bool = True
) -> subprocess.CompletedProcess:
    """One git command, its output captured (never the environment, which may hold a token); `text`
    False: its output as bytes (a file's content)."""
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=text, timeout=GIT_TIMEOUT_S, check=False
    )


def resolve_commit(url: str, ref: str, conn_id: str | None = None) -> str:
    """The commit `ref` names in the repository now (a branch, a tag, peeled, or a full commit id as given).
    A ref the repository does not have is refused (BundleRefused); a repository that does not answer
    is SourceFailed (retried)."""
    try:
        check_git_url(url)
        check_ref(ref)
    except ValueError as exc:  # the run spec's own checks, refused here as the code's
        raise BundleRefused(str(exc)) from None
    if COMMIT.fullmatch(ref):
        return ref
    with git_env(url, conn_id) as (where, env):
        listed = git(["ls-remote", "--", where, ref, f"{ref}^{{}}"], env)
    if listed.returncode != 0:
        raise SourceFailed(f"git ls-remote {url} failed: {listed.stderr.strip()[:500]}")
    refs = dict(reversed(line.split("\t", 1)) for line in listed.stdout.splitlines() if "\t" in line)
    for name in (f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}", f"refs/heads/{ref}", ref, f"{ref}^{{}}"):
        if COMMIT.fullmatch(refs.get(name, "")):
            return refs[name]
    raise BundleRefused(f"{url} has no branch or tag {ref!r}: push it, or name one that exists")


def fetch_commit(url: str, commit: str, dest: Path, conn_id: str | None = None) -> None:
    """Exactly `commit` checked out in `dest` (an empty directory): one commit, no history, no tags."""
    if not COMMIT.fullmatch(commit or ""):
        raise BundleRefused(f"{commit!r} is not a commit id (the first task resolves the ref to one)")
    with git_env(url, conn_id) as (where, env):
        steps = (
            ["init", "-q", str(dest)],
            ["-C", str(dest), "fetch", "-q", "--depth", "1", "--no-tags", "--", where, commit],
            ["-C", str(dest), "-c", "advice.detachedHead=false", "checkout", "-q", "--detach", "FETCH_HEAD"],
        )
        for step in steps:
            done = git(step, env)
            if done.returncode != 0:
                raise SourceFailed(
                    f"git {step[2] if step[0] == '-C' else step[0]} of {url} at {commit}: {done.stderr.strip()[:500]}"
                )
    got = git(["-C", str(dest), "rev-parse", "HEAD"], dict(os.environ)).stdout.strip()
    if got != commit:
        raise SourceFailed(f"fetched {got!r} from {url}, not the commit {commit} the run was resolved to")


def read_git_file(
    url: str, commit: str, path: str, dest: Path, *, max_bytes: int, conn_id: str | None = None
) -> bytes | None:
    """One file of `commit` (`path` from the repository's top), or None when the commit has none, fetched into
    `dest` (an empty directory) without the other files' contents: the commit's trees at depth 1, then that
    one blob (a partial fetch; a server that cannot filter sends the commit whole, as fetch_commit would).
    A file over `max_bytes` is refused (BundleRefused) before it is read."""
    if not COMMIT.fullmatch(commit or ""):
        raise BundleRefused(f"{commit!r} is not a commit id (the first task resolves the ref to one)")
    here = ["-C", str(dest)]
    with git_env(url, conn_id) as (where, env):
        steps = (
            ["init", "-q", str(dest)],
            [*here, "remote", "add", "origin", where],
            [*here, "config", "remote.origin.promisor", "true"],
            [*here, "config", "extensions.partialClone", "origin"],
            [*here, "fetch", "-q", "--depth", "1", "--no-tags", "--filter=blob:none", "origin", commit],
        )
        for step in steps:
            done = git(step, env)
            if done.returncode != 0:
                raise SourceFailed(
                    f"git {step[2] if step[0] == '-C' else step[0]} of {url} at {commit}: {done.stderr.strip()[:500]}"
                )
        entry = git([*here, "ls-tree", "-z", commit, "--", path], env).stdout  # from the tree: no blob fetched
        if not entry.startswith(("100644 blob ", "100755 blob ")):
            return None
        size = int(git([*here, "cat-file", "-s", f"{commit}:{path}"], env).stdout.strip() or 0)
        if size > max_bytes:
            raise BundleRefused(f"{path} at {commit} is {size} bytes, over the cap of {max_bytes}")
        blob = git([*here, "cat-file", "blob", f"{commit}:{path}"], env, text=False)
    if blob.returncode != 0:
        raise SourceFailed(f"git cat-file of {path} in {url} at {commit}: {blob.stderr.decode(errors='replace')[:500]}")
    return blob.stdout


def checkout_state(directory: Path) -> tuple[str | None, bool | None]:
    """(commit, dirty) of a directory that is a git checkout (dirty: a tracked change or an untracked file
    that is not ignored); (None, None) for one that is not."""
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    safe = ["-c", f"safe.directory={directory}", "-C", str(directory)]
    head = git([*safe, "rev-parse", "--verify", "-q", "HEAD"], env)
    top = git([*safe, "rev-parse", "--show-toplevel"], env)
    if head.returncode != 0 or top.returncode != 0:
        return None, None
    status = git([*safe, "status", "--porcelain", "--untracked-files=normal", "--", "."], env)
    return head.stdout.strip(), bool(status.stdout.strip())


def subdir_of(tree: Path, subdir: str | None) -> Path:
    """`tree/subdir` (the project inside a repository), refused unless it is a directory inside the tree."""
    if not subdir:
        return tree
    from pcflow.paths import within

    if subdir.startswith("/") or ".." in subdir.split("/"):
        raise BundleRefused(f"subdir {subdir!r} must be a relative path inside the repository")
    try:
        path = within(tree / subdir, tree)
    except ValueError as exc:
        raise BundleRefused(f"subdir {subdir!r}: {exc}") from None
    if not path.is_dir():
        raise BundleRefused(f"subdir {subdir!r} is not a directory of the repository")
    return path


@contextlib.contextmanager
def spooled_bundle(s3: Any, uri: str, *, max_bytes: int) -> Iterator[tarfile.TarFile]:
    """The tar (plain or compressed) at `uri`, read into a temporary file (at most `max_bytes`, else
    BundleRefused) and opened; one that is not a tar is refused."""
    from pcflow.datasource import split_s3_uri

    bucket, key = split_s3_uri(uri)
    key = key.rstrip("/")
    head = s3.head_object(Bucket=bucket, Key=key)
    if head["ContentLength"] > max_bytes:
        raise BundleRefused(f"{uri} is {head['ContentLength']} bytes, over the code's cap of {max_bytes}")
    with tempfile.TemporaryFile() as spool:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"]
        while chunk := body.read(1 << 20):
            spool.write(chunk)
            if spool.tell() > max_bytes:
                raise BundleRefused(f"{uri} is over the code's cap of {max_bytes} bytes")
        spool.seek(0)
        try:
            tar = tarfile.open(fileobj=spool, mode="r:*")
        except (tarfile.TarError, OSError) as exc:
            raise BundleRefused(f"{uri} is not a tar archive pcflow unpacks: {exc}") from None
        with tar:
            yield tar


def download_bundle(s3: Any, uri: str, dest: Path, *, max_bytes: int) -> None:
    """The tar (plain or compressed) at `uri` unpacked into `dest`: at most `max_bytes` read, members
    that would land outside `dest` or are devices refused by tarfile's `data` filter."""
    with spooled_bundle(s3, uri, max_bytes=max_bytes) as tar:
        try:
            tar.extractall(dest, filter="data")
        except (tarfile.TarError, OSError) as exc:
            raise BundleRefused(f"{uri} is not a tar archive pcflow unpacks: {exc}") from None


def read_bundle_file(s3: Any, uri: str, path: str, *, max_bytes: int, max_file_bytes: int) -> bytes | None:
    """One regular file of the tar at `uri` (`path` from the tree's top, as download_bundle unpacks it), or
    None when it holds none; one over `max_file_bytes` is refused (BundleRefused) before it is read."""
    with spooled_bundle(s3, uri, max_bytes=max_bytes) as tar:
        try:
            for member in tar:
                if posixpath.normpath(member.name.lstrip("/")) != path or not member.isfile():
                    continue
                if member.size > max_file_bytes:
                    raise BundleRefused(f"{path} in {uri} is {member.size} bytes, over the cap of {max_file_bytes}")
                return tar.extractfile(member).read(max_file_bytes + 1)
        except (tarfile.TarError, OSError) as exc:
            raise BundleRefused(f"{uri} is not a tar archive pcflow unpacks: {exc}") from None
    return None
