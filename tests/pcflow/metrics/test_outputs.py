"""The run's model and newest checkpoint, streamed from the static cluster (real sshd) to the moto
server's S3: multipart for large files, bounded in memory, copied once, nothing else of the run dir."""

from __future__ import annotations

import hashlib
import logging
import os
import tracemalloc
import uuid
from pathlib import Path

import pytest

from pcflow.metrics import outputs
from pcflow.metrics.outputs import list_outputs, save_outputs

pytestmark = pytest.mark.stack
log = logging.getLogger(__name__)
MIB = 1 << 20


@pytest.fixture
def run_dir(local_stack) -> Path:
    """A run directory as a job leaves it: model, three checkpoints, a checkpoint being written (hidden),
    a link to a file outside the run, the job's log."""
    path = local_stack.shared_root / "tests" / f"outputs-{uuid.uuid4().hex[:8]}"
    (path / "checkpoints").mkdir(parents=True)
    (path / "model.pt").write_bytes(os.urandom(60 * MIB))
    for epoch in (1, 2, 3):
        (path / "checkpoints" / f"epoch-000{epoch}.pt").write_bytes(f"checkpoint {epoch}".encode())
        os.utime(path / "checkpoints" / f"epoch-000{epoch}.pt", (1000 + epoch, 1000 + epoch))
    (path / "checkpoints" / ".epoch-0004.pt.tmp-1").write_bytes(b"half")
    (path / "checkpoints" / "outside.pt").symlink_to("/etc/hostname")
    (path / "job.log").write_text("log\n")
    yield path
    for child in sorted(path.rglob("*"), reverse=True):
        child.unlink() if not child.is_dir() or child.is_symlink() else child.rmdir()
    path.rmdir()


def test_model_and_newest_checkpoint_reach_s3_once_multipart_and_bounded(slurm, s3, bucket, run_dir, monkeypatch):
    monkeypatch.setattr(outputs, "PART_BYTES", 5 * MIB)  # S3's smallest part: 12 parts for the 60 MiB model
    monkeypatch.setattr(outputs, "MAX_BUFFERED_PARTS", 2)
    monkeypatch.setattr(outputs, "CONCURRENT_PARTS", 2)
    assert [f.path for f in list_outputs(slurm, str(run_dir))] == ["model.pt", "checkpoints/epoch-0003.pt"]

    tracemalloc.start()
    try:
        saved = save_outputs(slurm, s3, run_dir=str(run_dir), bucket=bucket, prefix="runs/k/model/", log=log)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert saved["model"] == f"s3://{bucket}/runs/k/model/model.pt"
    assert saved["checkpoint"] == f"s3://{bucket}/runs/k/model/checkpoints/epoch-0003.pt"
    assert saved["copied"] == ["model.pt", "checkpoints/epoch-0003.pt"] and saved["bytes"] == 60 * MIB + 12
    # Never the whole model in memory: a few parts (read ahead, in flight, the one being read), whatever
    # the model's size (measured: 20-23 MiB here, for any model size).
    assert peak < 6 * 5 * MIB, f"peak {peak / MIB:.1f} MiB of a 60 MiB model"

    model = s3.get_object(Bucket=bucket, Key="runs/k/model/model.pt")
    assert model["ETag"].strip('"').endswith("-12")  # a multipart upload of 12 parts
    assert hashlib.sha256(model["Body"].read()).digest() == hashlib.sha256((run_dir / "model.pt").read_bytes()).digest()
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"])
    assert keys == ["runs/k/model/checkpoints/epoch-0003.pt", "runs/k/model/model.pt"]

    again = save_outputs(slurm, s3, run_dir=str(run_dir), bucket=bucket, prefix="runs/k/model/", log=log)
    assert again["copied"] == [] and again["skipped"] == ["model.pt", "checkpoints/epoch-0003.pt"]
    (run_dir / "model.pt").write_bytes(b"retrained")  # another size: copied again
    assert save_outputs(slurm, s3, run_dir=str(run_dir), bucket=bucket, prefix="runs/k/model/", log=log)["copied"] == [
        "model.pt"
    ]


def test_a_run_without_outputs_saves_nothing_and_says_so(slurm, s3, bucket, local_stack):
    empty = local_stack.shared_root / "tests" / f"outputs-none-{uuid.uuid4().hex[:8]}"
    saved = save_outputs(slurm, s3, run_dir=str(empty), bucket=bucket, prefix="runs/k/model/", log=log)
    assert (saved["model"], saved["checkpoint"], saved["copied"]) == (None, None, [])
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket)
