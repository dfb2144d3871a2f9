"""A run's own code from its source to the cluster: pinned by the first task, then read, packed, uploaded
once and staged once, with what the run summary records of it.

`pin_code` (the first task) resolves a git ref to its commit and checks that a directory exists, so a bad
source is refused before anything costs money. `deliver` (the ship_payload task) reads the source into a
temporary directory (`pcflow.code.sources`), packs it (`pcflow.bundles`, the same filter for every
run, retry and backfill), puts it in the stack's bucket unless it is there (`pcflow.code.upload`) and
stages it on the cluster where the admin's payloads are staged (`pcflow.slurm.payload.ship`: once per
cluster and id, read-only, by one rename, checked file by file when it is there already). The cluster's
shared file system makes one staging serve every node of an N-node job.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pcflow.bundles import Bundle, BundleRefused, pack
from pcflow.code.hparams import schema_record
from pcflow.code.sources import Fetched, checkout_state, download_bundle, fetch_commit, resolve_commit, subdir_of
from pcflow.code.upload import bundle_from_bucket, bundle_key, commit_key, record_commit, recorded_commit, upload_once
from pcflow.errors import refused
from pcflow.slurm.payload import ship, staged_check

if TYPE_CHECKING:
    from pcflow.resolved import ResolvedRun
    from pcflow.runspec import CodeSettings, TrainingSettings


def pin_code(code: CodeSettings | None, owner: Callable[[str], str]) -> CodeSettings | None:
    """The run's code source (`training.code`) made exact: returned with a git ref's `commit`; a directory
    must be one. Refused (naming `training.code.*` and who may change it, `owner(path)`) when the ref or the
    directory does not exist."""
    if code is None:
        return None
    try:
        if git := code.git:
            commit = resolve_commit(git.url, git.ref, git.conn_id)
            return code.model_copy(update={"git": git.model_copy(update={"commit": commit})})
        if code.dir and not Path(code.dir).is_dir():
            raise BundleRefused(f"{code.dir} is not a directory on the Airflow worker")
    except BundleRefused as exc:
        setting = "training.code." + ("git.ref" if code.git else "dir")
        raise refused(setting, str(exc), owner(setting), BundleRefused) from None
    return code


def read_source(code: CodeSettings, work: Path, *, s3: Any, max_bytes: int) -> Fetched:
    """The code's tree in (or, for a directory, at) a path on this worker, and its provenance."""
    if git := code.git:
        commit = git.commit or resolve_commit(git.url, git.ref, git.conn_id)
        fetch_commit(git.url, commit, work / "repo", git.conn_id)
        return Fetched(subdir_of(work / "repo", git.subdir), "git", git.url, commit, False)
    if code.dir:
        directory = Path(code.dir)
        commit, dirty = checkout_state(directory)
        return Fetched(directory, "dir", str(directory), commit, dirty)
    (work / "s3").mkdir()
    download_bundle(s3, code.s3, work / "s3", max_bytes=max_bytes)
    return Fetched(work / "s3", "s3", code.s3)


def bundle_name(fetched: Fetched) -> str:
    """What the log calls the code: the repository's or directory's last name."""
    tail = (fetched.url or "code").rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]
    return tail.removesuffix(".git").removesuffix(".tar.gz").removesuffix(".tar") or "code"


def build(training: TrainingSettings, *, s3: Any) -> tuple[Bundle, Fetched, dict[str, Any] | None]:
    """The code's bundle, read from its source into a temporary directory removed afterwards, and what a
    commit's record keeps of its hyperparameter schema (pcflow.code.hparams.schema_record)."""
    limits = training.bundle
    with tempfile.TemporaryDirectory(prefix="pcflow-code-") as work:
        fetched = read_source(training.code, Path(work), s3=s3, max_bytes=limits.max_bytes)
        bundle = pack(
            fetched.tree, name=bundle_name(fetched), max_bytes=limits.max_bytes, allow_secrets=limits.allow_secrets
        )
        schema = schema_record(fetched.tree, training.hparams_schema)
    return bundle, fetched, schema


def deliver(run: ResolvedRun, hook: Any, *, shared_root: str, s3: Any, log: Any) -> dict[str, Any]:
    """The run's code on the cluster, and its provenance: source, url, commit, dirty, the bundle's id,
    size and files, the bytes uploaded (0 on a re-run) and whether the staged copy was reused. A git
    commit packed before is not fetched again (`from_record`)."""
    training, bucket = run.training, run.dataset.bucket
    git = training.code.git
    key = (
        commit_key(git.url, git.commit, git.subdir, training.bundle.model_dump(mode="json"))
        if git and git.commit
        else None
    )
    if key and (known := from_record(run, hook, key, shared_root=shared_root, s3=s3, log=log)):
        return known
    bundle, fetched, schema = build(training, s3=s3)
    uploaded = upload_once(s3, bucket, bundle, stack=run.stack)
    if key:
        record_commit(s3, bucket, key, bundle, stack=run.stack, hparams_schema=schema)
    log.info(
        "code %s (%s %s%s): bundle %s, %d files, %d bytes, %d uploaded to s3://%s/%s",
        *(bundle.name, fetched.source, fetched.url, f" at {fetched.commit}" if fetched.commit else ""),
        *(bundle.digest, bundle.files, len(bundle.data), uploaded["uploaded_bytes"], bucket, uploaded["key"]),
    )
    shipped = ship(hook, bundle, shared_root=shared_root, log=log)
    return {**shipped, **provenance(bundle, fetched), **uploaded}


def from_record(run: ResolvedRun, hook: Any, key: str, *, shared_root: str, s3: Any, log: Any) -> dict | None:
    """A git commit's code as an earlier run packed it (pcflow.code.upload's record): the cluster's copy
    checked against the record, or staged from the bundle in the bucket; None when there is no record
    or no bundle (the caller fetches and packs)."""
    bucket, git = run.dataset.bucket, run.training.code.git
    record = recorded_commit(s3, bucket, key)
    if record is None:
        return None
    fetched = Fetched(Path(), "git", git.url, git.commit, False)
    known = {"source": "git", "url": git.url, "commit": git.commit, "dirty": False}
    known |= {
        "bytes": record["bytes"],
        "files": record["files"],
        "uploaded_bytes": 0,
        "key": bundle_key(record["digest"]),
    }
    found = staged_check(hook, record["digest"], record["checksums"].encode(), shared_root=shared_root)
    if found.ok:
        log.info(
            "code %s at %s: bundle %s, recorded and on the cluster already: %s",
            git.url,
            git.commit,
            record["digest"],
            found.directory,
        )
        return {"name": record["name"], "digest": record["digest"], "dir": found.directory, "reused": True, **known}
    bundle = bundle_from_bucket(s3, bucket, record)
    if bundle is None:
        return None
    return {**ship(hook, bundle, shared_root=shared_root, log=log, found=found), **provenance(bundle, fetched), **known}


def provenance(bundle: Bundle, fetched: Fetched | None = None) -> dict[str, Any]:
    """What the run summary records of the code (an admin's payload: its source is `payload`)."""
    fetched = fetched or Fetched(Path(), "payload")
    return {
        "source": fetched.source,
        "url": fetched.url,
        "commit": fetched.commit,
        "dirty": fetched.dirty,
        "bytes": len(bundle.data),
        "files": bundle.files,
    }
