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
model). A file already in S3 with the same size and modification time is not copied again (a retried
harvest). A sweep keeps every trial's model, each beside its own report: a trial that is not the best
by the objective may still be the one wanted, and the cluster's copy is gone with its teardown.

The asset event that announces the model (its S3 URI, and the partition it was trained on): pcflow/lineage.py.
"""

from __future__ import annotations

import posixpath
import tarfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pcflow.slurm.hook import SlurmHook

MODEL_FILE = "model.pt"
CHECKPOINTS = "checkpoints"
#: Bytes of the output listing read at most (a job could leave any number of files behind).
LISTING_LIMIT = 1 << 20
PART_BYTES = 8 << 20
MAX_BUFFERED_PARTS = 4
CONCURRENT_PARTS = 4
SIZE_KEY, MTIME_KEY = "pcflow-source-size", "pcflow-source-mtime"
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


def list_outputs(hook: SlurmHook, run_dir: str) -> list[RemoteFile]:
    """The model and the newest checkpoint the job left in its run directory (either may be absent)."""
    listing = hook.run(["sh", "-c", LIST_SCRIPT, "sh", run_dir, str(LISTING_LIMIT)], check=False).stdout
    found, checkpoints = [], []
    for record in listing.split("\0"):
        mtime, _, rest = record.partition(" ")
        size, _, path = rest.partition(" ")
        if not size.isdigit() or (path != MODEL_FILE and posixpath.dirname(path) != CHECKPOINTS):
            continue
        (found if path == MODEL_FILE else checkpoints).append(RemoteFile(path, int(size), mtime))
    if checkpoints:
        found.append(max(checkpoints, key=lambda f: (float(f.mtime), f.path)))
    return found


class _CountingReader:
    """A non-seekable file object (S3's upload then reads it part by part) that counts what it gave."""

    def __init__(self, source: Any):
        self.source, self.count = source, 0

    def read(self, size: int = -1) -> bytes:
        data = self.source.read(size)  # a tar member reads exactly `size` bytes until its end
        self.count += len(data)
        return data


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
    return meta.get("Metadata", {}).get(SIZE_KEY) == str(file.size) and meta["Metadata"].get(MTIME_KEY) == file.mtime


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
                reader = _CountingReader(tar.extractfile(member))
                metadata = {SIZE_KEY: str(file.size), MTIME_KEY: file.mtime}
                s3.upload_fileobj(reader, bucket, prefix + member.name, ExtraArgs={"Metadata": metadata}, Config=config)
                if reader.count != member.size:
                    raise OSError(f"{run_dir}/{member.name}: {reader.count} of {member.size} bytes reached S3")
                sent += reader.count
    if wanted:
        raise OSError(f"{', '.join(sorted(wanted))} disappeared from {run_dir} while being copied")
    return sent


def save_outputs(hook: SlurmHook, s3: Any, *, run_dir: str, bucket: str, prefix: str, log: Any) -> dict[str, Any]:
    """Copy the run's model and newest checkpoint to `s3://<bucket>/<prefix>`; returns their URIs."""
    files = list_outputs(hook, run_dir)
    todo = [f for f in files if not _in_s3_already(s3, bucket, prefix + f.path, f)]
    sent = stream_to_s3(hook, s3, run_dir=run_dir, files=todo, bucket=bucket, prefix=prefix) if todo else 0
    uris = {f.path: f"s3://{bucket}/{prefix}{f.path}" for f in files}
    log.info(
        "outputs of %s: %d file(s) to s3://%s/%s (%d bytes), %d already there",
        run_dir,
        len(todo),
        bucket,
        prefix,
        sent,
        len(files) - len(todo),
    )
    checkpoint = next((uris[f.path] for f in files if f.path != MODEL_FILE), None)
    return {
        "prefix": f"s3://{bucket}/{prefix}",
        "model": uris.get(MODEL_FILE),
        "checkpoint": checkpoint,
        "copied": [f.path for f in todo],
        "skipped": [f.path for f in files if f not in todo],
        "bytes": sent,
    }
