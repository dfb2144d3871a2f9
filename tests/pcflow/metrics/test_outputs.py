"""The run's model and newest checkpoint, streamed from the static cluster (real sshd) to the moto
server's S3: multipart for large files, bounded in memory, copied once, nothing else of the run dir;
each file's sha256 computed on the cluster, checked on the bytes uploaded, recorded; and a later run's
load of an artifact refuses bytes without the recorded hash."""

from __future__ import annotations

import hashlib
import logging
import os
import tracemalloc
import uuid
from pathlib import Path

import pytest

from pcflow.artifacts import ArtifactRefused, load_artifact
from pcflow.checksums import ChecksumMismatch, s3_checksum
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
    sha256 = hashlib.sha256((run_dir / "model.pt").read_bytes()).hexdigest()
    assert hashlib.sha256(model["Body"].read()).hexdigest() == sha256 == saved["model_sha256"]
    assert model["Metadata"] == {"pcflow-sha256": sha256}
    checkpoint = s3.head_object(Bucket=bucket, Key="runs/k/model/checkpoints/epoch-0003.pt", ChecksumMode="ENABLED")
    assert saved["checkpoint_sha256"] == hashlib.sha256(b"checkpoint 3").hexdigest()
    assert checkpoint["ChecksumSHA256"] == s3_checksum(saved["checkpoint_sha256"])  # one PUT: the whole file's
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"])
    assert keys == ["runs/k/model/checkpoints/epoch-0003.pt", "runs/k/model/model.pt"]

    again = save_outputs(slurm, s3, run_dir=str(run_dir), bucket=bucket, prefix="runs/k/model/", log=log)
    assert again["copied"] == [] and again["skipped"] == ["model.pt", "checkpoints/epoch-0003.pt"]
    (run_dir / "model.pt").write_bytes(b"retrained")  # another hash: copied again
    assert save_outputs(slurm, s3, run_dir=str(run_dir), bucket=bucket, prefix="runs/k/model/", log=log)["copied"] == [
        "model.pt"
    ]


def test_a_run_without_outputs_saves_nothing_and_says_so(slurm, s3, bucket, local_stack):
    empty = local_stack.shared_root / "tests" / f"outputs-none-{uuid.uuid4().hex[:8]}"
    saved = save_outputs(slurm, s3, run_dir=str(empty), bucket=bucket, prefix="runs/k/model/", log=log)
    assert (saved["model"], saved["checkpoint"], saved["copied"]) == (None, None, [])
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket)


def changed_after_hashing(monkeypatch, path: Path, data: bytes) -> None:
    """The file is rewritten (same size) right after the cluster hashed it: as a job still writing would."""
    real = outputs.hash_outputs

    def then_rewrite(*args, **kwargs):
        hashed = real(*args, **kwargs)
        path.write_bytes(data)
        return hashed

    monkeypatch.setattr(outputs, "hash_outputs", then_rewrite)


@pytest.mark.security
@pytest.mark.parametrize("multipart", [True, False], ids=["multipart", "one-put"])
def test_a_file_that_changes_between_its_hash_and_its_copy_never_reaches_s3(  # noqa: PLR0917 - fixtures
    slurm, s3, bucket, run_dir, monkeypatch, multipart
):
    monkeypatch.setattr(outputs, "PART_BYTES", 5 * MIB)
    if not multipart:
        (run_dir / "model.pt").write_bytes(b"small model")
    size = (run_dir / "model.pt").stat().st_size
    changed_after_hashing(monkeypatch, run_dir / "model.pt", b"X" * size)
    with pytest.raises(ChecksumMismatch, match=r"model\.pt .*the bytes changed after they were hashed"):
        save_outputs(slurm, s3, run_dir=str(run_dir), bucket=bucket, prefix="runs/k/model/", log=log)
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket, Prefix="runs/k/model/model.pt")
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")  # aborted, nothing left billing


@pytest.mark.security
def test_a_later_run_loads_an_artifact_only_with_the_hash_its_run_recorded(slurm, s3, bucket, run_dir, tmp_path):
    saved = save_outputs(slurm, s3, run_dir=str(run_dir), bucket=bucket, prefix="runs/k/model/", log=log)
    loaded = load_artifact(s3, saved["model"], saved["model_sha256"], tmp_path / "model.pt")
    assert loaded.read_bytes() == (run_dir / "model.pt").read_bytes()

    # Someone with write access to the bucket replaces the model (same size, metadata copied along).
    key = "runs/k/model/model.pt"
    meta = s3.head_object(Bucket=bucket, Key=key)["Metadata"]
    s3.put_object(Bucket=bucket, Key=key, Body=os.urandom(60 * MIB), Metadata=meta)
    with pytest.raises(ArtifactRefused, match=r"sha256 .* were recorded: .*Someone changed the object after that run"):
        load_artifact(s3, saved["model"], saved["model_sha256"], tmp_path / "again.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]  # nothing kept of the refused download

    with pytest.raises(ArtifactRefused, match="over the 1048576-byte limit"):
        load_artifact(s3, saved["model"], saved["model_sha256"], tmp_path / "big.pt", max_bytes=MIB)
    with pytest.raises(ArtifactRefused, match="only with its hash"):
        load_artifact(s3, saved["checkpoint"], None, tmp_path / "c.pt")
    checkpoint = load_artifact(s3, saved["checkpoint"], saved["checkpoint_sha256"], tmp_path / "c.pt")
    assert checkpoint.read_bytes() == b"checkpoint 3"


def test_the_checkpoint_copied_is_the_newest_its_sidecar_verifies_never_a_sidecar(slurm, s3, bucket, run_dir):
    """The checkpoint contract's sidecars (size and sha256 as the program wrote them): the newest checkpoint
    with one is chosen over a newer one without (its write did not finish), a sidecar is never copied as a
    checkpoint, and a checkpoint whose bytes no longer match its sidecar (cut short) is not copied at all."""
    checkpoints = run_dir / "checkpoints"
    data = b"checkpoint 2, whole"
    record = f'{{"file": "epoch-0002.pt", "size": {len(data)}, "sha256": "{hashlib.sha256(data).hexdigest()}"}}'
    (checkpoints / "epoch-0002.pt").write_bytes(data)
    (checkpoints / "epoch-0002.pt.sha256.json").write_text(record)
    for name, when in (("epoch-0002.pt", 2000), ("epoch-0002.pt.sha256.json", 2001), ("epoch-0003.pt", 3000)):
        os.utime(checkpoints / name, (when, when))  # epoch-0003 (the fixture's) is the newest, without a sidecar
    assert [f.path for f in list_outputs(slurm, str(run_dir))] == ["model.pt", "checkpoints/epoch-0002.pt"]
    saved = save_outputs(slurm, s3, run_dir=str(run_dir), bucket=bucket, prefix="runs/v/model/", log=log)
    assert saved["checkpoint"] == f"s3://{bucket}/runs/v/model/checkpoints/epoch-0002.pt"
    assert saved["checkpoint_sha256"] == hashlib.sha256(data).hexdigest()

    (checkpoints / "epoch-0002.pt").write_bytes(data[:8])  # cut short: its sidecar still records the whole file
    os.utime(checkpoints / "epoch-0002.pt", (2000, 2000))
    saved = save_outputs(slurm, s3, run_dir=str(run_dir), bucket=bucket, prefix="runs/w/model/", log=log)
    assert saved["checkpoint"] is None and saved["copied"] == ["model.pt"]
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="runs/w/")["Contents"]]
    assert keys == ["runs/w/model/model.pt"]
