"""Ship a training payload (the code a job runs) to the cluster with each run, by content hash.

The payload is a directory of `include/payloads/` or `examples/` (the deployment's code, admin-owned:
`examples/simclr` is what the shipped profiles train). Each run
packs it into a deterministic tar (sorted names, zero times and owners, modes 0644/0755), names it by
the tar's sha256, and extracts it once per hash into `<shared root>/pcflow/payloads/<hash>/`: a run
whose payload is already there reuses it; a changed payload gets a new directory, so the next run
picks it up without a new image (the image holds the environment only). The directory appears by one
rename of a fully extracted temporary directory, so a reader never sees half a payload, and it is
made read-only, so no job can change the code another run with the same hash will run. The copy is
one `tar -x` fed over SSH, as the dataset's stage-in does; every member is a plain file or directory
pcflow named itself, inside the payload's own directory.

A directory that exists is not trusted for it: the archive knows every file's sha256, and one command
(`pcflow.slurm.trees.compare_tree`) checks that the directory holds exactly those files with those
hashes, nothing else, and nothing another user could change. One that does not match is moved aside,
never deleted (`rejected-<digest>-<UTC time>` beside it, with what was wrong in `<that>.why`, for an
admin to look at and remove), and the payload is staged again.
"""

from __future__ import annotations

import datetime as dt
import posixpath
import uuid

from pcflow.bundles import Bundle, BundleRefused, pack
from pcflow.paths import PayloadError, payload_source, remote_within
from pcflow.patterns import ABS_PATH
from pcflow.slurm.hook import SlurmHook
from pcflow.slurm.trees import TreeCheck, compare_tree

#: A payload is code: data goes through the dataset stage. A larger one is refused rather than shipped.
MAX_PAYLOAD_BYTES = 64 << 20
#: Staged payloads that did not match their archive are moved to `<payloads>/rejected-<digest>-<time>-<id>`.
REJECTED_PREFIX = "rejected-"
#: A payload is packed as a run's own code is (pcflow.bundles): one archive format, one filter.
PayloadArchive = Bundle


def build_archive(name: str) -> PayloadArchive:
    """The payload's deterministic bundle and its digest: the same files give the same bytes
    (pcflow.bundles: the admin's payloads and a run's own code are packed and filtered alike)."""
    source = payload_source(name)
    try:
        return pack(source, name=name, max_bytes=MAX_PAYLOAD_BYTES, allow_secrets=False)
    except BundleRefused as exc:
        raise PayloadError(f"payload {name}: {exc}") from None


def payload_root(shared_root: str) -> str:
    """`<shared root>/pcflow/payloads`; a shared root that is not a plain absolute path is refused (it names a
    remote directory)."""
    if not ABS_PATH.fullmatch(shared_root or ""):
        raise PayloadError(
            f"shared root must be an absolute path of letters, digits and _.@+-/ (got {shared_root!r}); set the "
            "cluster connection's `shared_root` extra"
        )
    return posixpath.join(shared_root, "pcflow", "payloads")


def staged_check(hook: SlurmHook, digest: str, checksums: bytes, *, shared_root: str) -> TreeCheck:
    """`<shared root>/pcflow/payloads/<digest>/` checked against `checksums` (one command): what `ship`
    asks first, and what a caller that knows the bundle's id and files but not its bytes asks alone."""
    root = payload_root(shared_root)
    return compare_tree(hook, remote_within(posixpath.join(root, digest), root), checksums)


def ship(
    hook: SlurmHook, archive: Bundle, *, shared_root: str, log, found: TreeCheck | None = None
) -> dict[str, object]:
    """`<shared root>/pcflow/payloads/<digest>/` holding exactly the archive's files: reused when the one
    there matches (one check; `found` when the caller made it already), else staged, a directory that does
    not match moved aside first."""
    root = payload_root(shared_root)
    final = remote_within(posixpath.join(root, archive.digest), root)
    if found is None or found.directory != final:
        found = compare_tree(hook, final, archive.checksums)
    if found.ok:
        log.info(
            "payload %s %s is on the cluster already, every file as shipped: %s", archive.name, archive.digest, final
        )
        return {"name": archive.name, "digest": archive.digest, "dir": final, "reused": True}
    if not found.absent:
        set_aside(hook, root, found, log)
    stage(hook, archive, root, final)
    log.info("payload %s shipped to %s (%d files, %d bytes)", archive.name, final, archive.files, len(archive.data))
    return {"name": archive.name, "digest": archive.digest, "dir": final, "reused": False}


def set_aside(hook: SlurmHook, root: str, found: TreeCheck, log) -> str:
    """Move a staged payload that is not what was shipped out of the way, under a name an admin (or a
    cleanup) finds: `rejected-<digest>-<UTC time>`, with the findings in `<that>.why`. Never deleted:
    it is evidence of what changed it."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    aside = posixpath.join(
        root, f"{REJECTED_PREFIX}{posixpath.basename(found.directory)}-{stamp}-{uuid.uuid4().hex[:6]}"
    )
    log.warning(
        "payload directory %s is not what pcflow shipped: %s. Moving it aside to %s and staging the payload again",
        found.directory,
        found.summary(),
        aside,
    )
    moved = hook.run(["mv", "-T", "--", found.directory, aside], check=False)
    if moved.exit_code != 0:
        if hook.is_dir(found.directory):  # not a concurrent run that moved it first: refuse to run on it
            raise PayloadError(
                f"payload directory {found.directory} does not match what was shipped ({found.summary()}) and could "
                f"not be moved aside: {moved.stderr.strip()[:500]}. An admin must inspect and remove it."
            )
        return aside
    hook.write_file(aside + ".why", "\n".join(found.findings) + "\n")
    return aside


def stage(hook: SlurmHook, archive: PayloadArchive, root: str, final: str) -> None:
    """Extract into a temporary directory, make it read-only, rename it into place in one step."""
    tmp = posixpath.join(root, f".tmp-{archive.digest}-{uuid.uuid4().hex[:8]}")
    hook.makedirs(tmp)
    try:
        with hook.command_input(["tar", "-x", "-f", "-", "-C", tmp, "--no-same-owner"]) as sink:
            sink.write(archive.data)
        hook.run(["chmod", "-R", "a-w", "--", tmp])
        moved = hook.run(["mv", "-T", "--", tmp, final], check=False)
        if moved.exit_code != 0:  # a concurrent run shipped the same digest: adopted only if it matches
            theirs = compare_tree(hook, final, archive.checksums)
            if theirs.absent:
                moved.check()
            if not theirs.ok:
                raise PayloadError(
                    f"payload directory {final} appeared while staging but does not match: {theirs.summary()}"
                )
    finally:
        hook.run(["sh", "-c", 'test ! -e "$1" || { chmod -R u+w "$1"; rm -rf "$1"; }', "sh", tmp], check=False)
