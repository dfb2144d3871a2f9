"""A loaded partition staged into a static cluster's shared directory: one `tar -x` over the real sshd,
files equal to their sources, unchanged files skipped, objects that no longer match the manifest refused."""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path

import pytest

from pcflow.dataset.manifest import read_manifest
from pcflow.dataset.stage_in import copy_partition
from pcflow.dataset.sync import sync_to_s3
from pcflow.slurm.hook import SlurmError, SlurmHook

pytestmark = pytest.mark.stack
log = logging.getLogger(__name__)


@pytest.fixture
def hook(local_stack):
    hook = SlurmHook()
    yield hook
    hook.close()


def test_stage_in_copies_once_skips_what_is_there_and_refuses_a_changed_object(s3, bucket, hook, local_stack, tmp_path):
    src = tmp_path / "src"
    files = {f"class-{i % 3}/img {i}.png": bytes([i]) * (100 + i) for i in range(40)}  # a space in every name
    files["deep/er/still.bin"] = b"\0" * 70_000
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    loaded = sync_to_s3(s3, str(src), bucket=bucket, prefix="ds", partition="p", workers=4)
    dest = str(local_stack.shared_root / "tests" / f"stage-{uuid.uuid4().hex[:8]}")
    stage = {"bucket": bucket, "root": loaded["root"], "dest": dest, "log": log}

    assert copy_partition(s3, hook, **stage) == {"copied": 41, "skipped": 0, "files": 41}
    staged = {str(p.relative_to(dest)): p.read_bytes() for p in Path(dest).rglob("*") if p.is_file()}
    assert json.loads(staged.pop("manifest.json")) == read_manifest(s3, bucket, loaded["root"])  # what FSx shows
    assert staged == files
    assert copy_partition(s3, hook, **stage) == {"copied": 0, "skipped": 41, "files": 41}

    Path(dest, "class-0/img 0.png").write_bytes(b"torn")  # a copy cut short: another size
    assert copy_partition(s3, hook, **stage)["copied"] == 1
    assert Path(dest, "class-0/img 0.png").read_bytes() == files["class-0/img 0.png"]

    Path(dest, "class-1/img 1.png").unlink()
    s3.put_object(Bucket=bucket, Key=loaded["root"] + "class-1/img 1.png", Body=b"x" * 101)  # not what was loaded
    with pytest.raises(ValueError, match=r"class-1/img 1\.png does not match the manifest's sha256"):
        copy_partition(s3, hook, **stage)
    assert not Path(dest, "class-1/img 1.png").exists()


def test_a_failing_extraction_is_reported(hook):
    extract = ["tar", "-x", "-f", "-", "-C", "/nonexistent/x"]
    failed = r"`tar -x -f - -C /nonexistent/x` failed"
    with pytest.raises(SlurmError, match=failed), hook.command_input(extract) as sink:
        sink.write(b"not a tar archive" * 100)


@pytest.mark.security
def test_objects_are_read_only_to_the_size_pcflow_recorded(s3, bucket, monkeypatch):
    """A manifest entry is read to its recorded size, and a JSON document pcflow keeps (manifest,
    journal) to a bound: an object replaced by a larger one (a job with write access, another writer)
    is refused, not read whole into the worker."""
    from pcflow.aws.clients import ObjectTooLarge
    from pcflow.dataset import manifest

    s3.put_object(Bucket=bucket, Key="p/a.png", Body=b"x" * 100)
    assert manifest.read_listed_object(s3, bucket, "p/", {"key": "a.png", "size": 100}) == b"x" * 100
    with pytest.raises(ObjectTooLarge, match="larger than 10 bytes"):
        manifest.read_listed_object(s3, bucket, "p/", {"key": "a.png", "size": 10})
    s3.put_object(Bucket=bucket, Key="p/manifest.json", Body=b"{}" + b" " * 2000)
    monkeypatch.setattr(manifest, "MAX_DOCUMENT_BYTES", 1000)
    with pytest.raises(ObjectTooLarge):
        manifest.read_json_object(s3, bucket, "p/manifest.json")
