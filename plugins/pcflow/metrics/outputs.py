"""The run's outputs in S3: the final model and the newest checkpoint, copied from the cluster while it
is still up, to `s3://<bucket>/runs/<run key>/model/` (a sweep: `runs/<run key>/trials/<i>/model/`).

One path for both profiles: the head node, over the same SSH connection the harvest reads metrics
through. A static cluster has nothing else; on ParallelCluster the run directory is on FSx, which the
head node mounts, so no FSx export has to run (an export writes back every change of the whole file
system, asynchronously, and a nightly's file system is not deleted at all) and the cluster's nodes
need no S3 write access. The copy is one `tar -c` read over SSH as a stream (flow control keeps one
channel window in memory) and fed to S3's managed upload part by part (multipart above 8 MiB; at
most MAX_BUFFERED_PARTS parts read ahead, CONCURRENT_PARTS in flight): a few parts in memory whatever
the model's size (measured with 5 MiB parts, two of each: a peak of 20-23 MiB for a 30 or a 60 MiB
model). A sweep keeps every trial's model, each beside its own report: a trial that is not the best
by the objective may still be the one wanted, and the cluster's copy is gone with its teardown.

Each file's sha256 is computed on the cluster before the copy (`sha256sum`, one command) and checked
again on the bytes as they stream to S3: the upload stops before its last byte (a single PUT before it
is sent, a multipart upload before it completes, and s3transfer then aborts it) when they differ, e.g.
a job still writing the file. S3 checks what it receives as well: a single PUT carries the whole file's
`ChecksumSHA256`, a multipart upload each part's (S3 has no whole-object SHA-256 for multipart uploads;
its checksum of one is a checksum of the parts'). The moto server stores those checksums but verifies
none (moto 5.2.5: a PUT with a wrong ChecksumSHA256 is accepted), so on the local stack pcflow's own
check is the one that runs. The hashes are the run's record of what it wrote (the summary, the model's
asset event, metrics.json and the report): a later run loads an artifact through
`pcflow.artifacts.load_artifact`, which refuses bytes that do not have them. A file whose hash is
already on the S3 object (`pcflow-sha256`, a retried harvest) is not copied again.

Checkpoints that follow the checkpoint contract (include/payloads/README.md) each have a sidecar,
`<name>.sha256.json`, with the size and sha256 the program wrote: the checkpoint copied is then the newest
with a sidecar, and only when the bytes hashed on the cluster match it (size and sha256); one that does not
(cut short, damaged) is not copied and the log says so: S3 never holds a checkpoint a resume would refuse.
A sidecar is never copied as a checkpoint.

The asset event that announces the model (its S3 URI, and the partition it was trained on): pcflow/lineage.py.
"""

from __future__ import annotations

import posixpath
import tarfile
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pcflow.checksums import ODD_NAME, SHA256_KEY, HashingReader, parse_checksum_list, s3_checksum

if TYPE_CHECKING:
    from pcflow.slurm.hook import SlurmHook

MODEL_FILE = "model.pt"
CHECKPOINTS = "checkpoints"
#: The checkpoint contract's sidecar beside each checkpoint: `<checkpoint name>` + this.
SIDECAR_SUFFIX = ".sha256.json"
#: Bytes of the output listing read at most (a job could leave any number of files behind).
LISTING_LIMIT = 1 << 20
PART_BYTES = 8 << 20
MAX_BUFFERED_PARTS = 4
CONCURRENT_PARTS = 4
#: `sha256sum` of the files in the run directory (names as list_outputs found them), NUL-free and bounded.
HASH_SCRIPT = 'cd "$1" && shift && exec sha256sum -- "$@"'
#: `find` of the model and the checkpoints (plain files, not hidden: temporary files start with a dot).
LIST_SCRIPT = (
    'cd "$1" 2>/dev/null || exit 0; find model.pt checkpoints -maxdepth 1 -type f ! -name ".*" '
    '-printf "%T@ %s %p\\0" 2>/dev/null | head -c "$2"'
)


@dataclass(frozen=True)
class RemoteFile:
    """A file of the run directory as `find` saw it: size and mtime decide whether the copy in S3 is already
    this one."""

    path: str  # relative to the run directory
    size: int
    mtime: str  # as find printed it: compared, never computed with
    sha256: str = ""  # hex, computed on the cluster (hash_outputs)
    sidecar: str = ""  # a checkpoint's sidecar (its size and sha256 as the program wrote them), if it has one


def list_outputs(hook: SlurmHook, run_dir: str) -> list[RemoteFile]:
    """The model and the newest checkpoint the job left in its run directory (either may be absent)."""
    listing = hook.run(["sh", "-c", LIST_SCRIPT, "sh", run_dir, str(LISTING_LIMIT)], check=False).stdout
    found, checkpoints = [], []
    for record in listing.split("\0"):
        mtime, _, rest = record.partition(" ")
        size, _, path = rest.partition(" ")
        if not size.isdigit() or (path != MODEL_FILE and posixpath.dirname(path) != CHECKPOINTS):
            continue
        if ODD_NAME.search(path):  # not a name the job's payload writes, nor one a checksum list can carry
            continue
        (found if path == MODEL_FILE else checkpoints).append(RemoteFile(path, int(size), mtime))
    newest = newest_checkpoint(checkpoints)
    return [*found, newest] if newest else found


def newest_checkpoint(files: list[RemoteFile]) -> RemoteFile | None:
    """The newest checkpoint, never a sidecar; among those with a sidecar when any has one (a newer one without
    is a write that did not finish)."""
    sidecars = {f.path.removesuffix(SIDECAR_SUFFIX) for f in files if f.path.endswith(SIDECAR_SUFFIX)}
    candidates = [f for f in files if not f.path.endswith(SIDECAR_SUFFIX)]
    recorded = [replace(f, sidecar=f.path + SIDECAR_SUFFIX) for f in candidates if f.path in sidecars]
    return max(recorded or candidates, key=lambda f: (float(f.mtime), f.path), default=None)


def verified(hook: SlurmHook, run_dir: str, files: list[RemoteFile], log: Any) -> list[RemoteFile]:
    """The files whose bytes, as hashed on the cluster, are what their sidecar records (a file without one
    passes): a checkpoint that does not match is left out, said in the log."""
    kept = []
    for file in files:
        record = hook.read_json(posixpath.join(run_dir, file.sidecar)) if file.sidecar else None
        if file.sidecar and (record is None or (record.get("size"), record.get("sha256")) != (file.size, file.sha256)):
            log.warning(
                "Not copying %s/%s: %d bytes, sha256 %s, its sidecar %s records %s (a checkpoint cut short or "
                "damaged); a resume passes over it too",
                run_dir,
                file.path,
                file.size,
                file.sha256,
                file.sidecar,
                record,
            )
            continue
        kept.append(file)
    return kept


def hash_outputs(hook: SlurmHook, run_dir: str, files: list[RemoteFile]) -> list[RemoteFile]:
    """The files with their sha256 as the cluster computes it now, before any byte is copied."""
    if not files:
        return []
    result = hook.run(["sh", "-c", HASH_SCRIPT, "sh", run_dir, *(f.path for f in files)])
    hashes = parse_checksum_list(result.stdout, max_entries=len(files))
    missing = [f.path for f in files if f.path not in hashes]
    if missing:
        raise OSError(f"sha256sum in {run_dir} did not hash {', '.join(missing)}")
    return [replace(f, sha256=hashes[f.path]) for f in files]


def transfer_config() -> Any:
    """S3's managed upload sized for a stream from the cluster: a few parts in memory whatever the model's size."""
    from boto3.s3.transfer import TransferConfig

    config = TransferConfig(
        multipart_threshold=PART_BYTES, multipart_chunksize=PART_BYTES, max_concurrency=CONCURRENT_PARTS
    )
    config.max_in_memory_upload_chunks = MAX_BUFFERED_PARTS  # s3transfer's bound on parts read ahead
    return config


def _in_s3_already(s3: Any, bucket: str, key: str, file: RemoteFile) -> bool:
    from botocore.exceptions import ClientError

    try:
        meta = s3.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if exc.response["Error"]["Code"] in ("404", "NoSuchKey", "NotFound"):
            return False
        raise
    return meta.get("Metadata", {}).get(SHA256_KEY) == file.sha256


def upload_member(s3: Any, reader: HashingReader, *, bucket: str, key: str, config: Any) -> None:
    """One file to S3, checked against its sha256 on the way (the reader) and by S3 (ChecksumSHA256)."""
    metadata = {SHA256_KEY: reader.expected}
    if reader.size < PART_BYTES:  # one PUT: S3 refuses it unless the whole body has this SHA-256
        body = reader.read(reader.size)
        reader.check()
        s3.put_object(
            Bucket=bucket,
            Key=key,
            Body=body,
            Metadata=metadata,
            ChecksumAlgorithm="SHA256",
            ChecksumSHA256=s3_checksum(reader.expected),
        )
        return
    extra = {"Metadata": metadata, "ChecksumAlgorithm": "SHA256"}  # each part's SHA-256, checked by S3
    s3.upload_fileobj(reader, bucket, key, ExtraArgs=extra, Config=config)
    reader.check()


def stream_to_s3(hook: SlurmHook, s3: Any, *, run_dir: str, files: list[RemoteFile], bucket: str, prefix: str) -> int:
    """One `tar -c` of `files` over SSH, each member uploaded to `<prefix><path>` as it streams by."""
    wanted = {f.path: f for f in files}
    config, sent = transfer_config(), 0
    with hook.command_output(["tar", "-c", "-f", "-", "-C", run_dir, "--", *wanted]) as stream:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                file = wanted.pop(member.name, None)
                if file is None or not member.isfile():
                    continue
                what = f"{run_dir}/{member.name} (sha256 computed on the cluster before the copy)"
                reader = HashingReader(tar.extractfile(member), size=member.size, sha256=file.sha256, what=what)
                upload_member(s3, reader, bucket=bucket, key=prefix + member.name, config=config)
                sent += reader.count
    if wanted:
        raise OSError(f"{', '.join(sorted(wanted))} disappeared from {run_dir} while being copied")
    return sent


def save_outputs(hook: SlurmHook, s3: Any, *, run_dir: str, bucket: str, prefix: str, log: Any) -> dict[str, Any]:
    """Copy the run's model and newest checkpoint to `s3://<bucket>/<prefix>`; returns their URIs and sha256."""
    files = verified(hook, run_dir, hash_outputs(hook, run_dir, list_outputs(hook, run_dir)), log)
    todo = [f for f in files if not _in_s3_already(s3, bucket, prefix + f.path, f)]
    sent = stream_to_s3(hook, s3, run_dir=run_dir, files=todo, bucket=bucket, prefix=prefix) if todo else 0
    uris = {f.path: f"s3://{bucket}/{prefix}{f.path}" for f in files}
    log.info(
        "outputs of %s: %d file(s) to s3://%s/%s (%d bytes, sha256 checked), %d already there: %s",
        run_dir,
        len(todo),
        bucket,
        prefix,
        sent,
        len(files) - len(todo),
        ", ".join(f"{f.path} {f.sha256}" for f in files) or "none",
    )
    model = next((f for f in files if f.path == MODEL_FILE), None)
    checkpoint = next((f for f in files if f.path != MODEL_FILE), None)
    return {
        "prefix": f"s3://{bucket}/{prefix}",
        "model": uris.get(MODEL_FILE),
        "model_sha256": model.sha256 if model else None,
        "checkpoint": uris[checkpoint.path] if checkpoint else None,
        "checkpoint_sha256": checkpoint.sha256 if checkpoint else None,
        "copied": [f.path for f in todo],
        "skipped": [f.path for f in files if f not in todo],
        "bytes": sent,
    }
