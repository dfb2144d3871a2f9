"""Pure logic of the dataset stage: partitions, sample keys, shard planning, progress cadence, FSx paths."""

from __future__ import annotations

import datetime as dt
import logging
from types import SimpleNamespace

import pytest

from pcflow.dataset.fsx import covers
from pcflow.dataset.manifest import content_hash, partition_root
from pcflow.dataset.partition import resolve_partition, validate_partition
from pcflow.dataset.progress import Progress
from pcflow.dataset.shard import group_samples, plan_shards, sample_key
from pcflow.dataset.sources import SourceFile, split_s3_uri


def test_partition_is_the_logical_date_when_scheduled_and_explicit_by_hand():
    scheduled = {"dag_run": SimpleNamespace(run_type="scheduled"), "logical_date": dt.datetime(2026, 11, 29, 3)}
    assert resolve_partition(scheduled) == "2026-11-29"
    backfill = {"dag_run": SimpleNamespace(run_type="backfill"), "logical_date": dt.datetime(2025, 1, 2)}
    assert resolve_partition(backfill) == "2025-01-02"
    manual = {"dag_run": SimpleNamespace(run_type="manual"), "logical_date": dt.datetime(2026, 11, 29)}
    with pytest.raises(ValueError, match="triggered by hand"):
        resolve_partition(manual)
    assert resolve_partition(manual, "v3") == "v3"
    for bad in ("", "a/b", "..", "x" * 200, "-x"):
        with pytest.raises(ValueError):
            validate_partition(bad)
    assert partition_root("/datasets/imagenet/", "2026-11-29") == "datasets/imagenet/2026-11-29/"


def test_sample_keys_follow_webdataset():
    assert sample_key("cat/n01.jpg") == ("cat/n01", "jpg")
    assert sample_key("a/x.seg.png") == ("a/x", "seg.png")
    assert sample_key("plain") == ("plain", "bin")
    files = [SourceFile(r, 10, "v") for r in ("b/2.png", "a/1.png", "a/1.json", "b/3.png")]
    samples, classes = group_samples(files)
    assert classes == ["a", "b"] and [s.key for s in samples] == ["a/1", "b/2", "b/3"]
    assert [len(s.files) for s in samples] == [2, 1, 1] and [s.label for s in samples] == [0, 1, 1]
    flat, none = group_samples([SourceFile("x.png", 1, "v")])
    assert none == [] and flat[0].label is None


def test_shard_plan_is_deterministic_and_bounded():
    files = [SourceFile(f"c{i % 4}/s{i:04d}.png", 1000 + i, "v") for i in range(500)]
    samples, _ = group_samples(files)
    a = plan_shards(samples, target_bytes=50_000, seed=3)
    b = plan_shards(samples, target_bytes=50_000, seed=3)
    assert [[s.key for s in sh] for sh in a] == [[s.key for s in sh] for sh in b]
    assert [s.key for sh in plan_shards(samples, target_bytes=50_000, seed=4) for s in sh] != [
        s.key for sh in a for s in sh
    ]
    assert sorted(s.key for sh in a for s in sh) == sorted(s.key for s in samples)
    assert all(sum(s.size for s in sh) <= 50_000 for sh in a)
    with pytest.raises(ValueError):
        plan_shards(samples, target_bytes=0, seed=None)


def test_progress_logs_at_a_steady_cadence_not_per_object(caplog):
    now = [0.0]
    progress = Progress(
        total_files=1000, total_bytes=1000, log=logging.getLogger("t"), interval_s=10, clock=lambda: now[0]
    )
    with caplog.at_level(logging.INFO, logger="t"):
        for _ in range(1000):
            now[0] += 0.05  # 50 s in all
            progress.advance(nbytes=1, uploaded=True)
        progress.report(final=True)
    lines = [r.getMessage() for r in caplog.records]
    assert 4 <= len(lines) - 1 <= 5, lines  # about one line per 10 s of a 50 s load, not 1000
    assert "ETA" in lines[0] and "MiB/s" in lines[0] and "done" in lines[-1]


def test_fsx_link_covers_whole_prefix_segments():
    assert covers("s3://b/datasets", "s3://b/datasets/digits/p/")
    assert not covers("s3://b/data", "s3://b/datasets/p/")


def test_content_hash_and_s3_uris():
    a = [{"key": "x", "sha256": "1"}, {"key": "y", "sha256": "2"}]
    assert content_hash(a) == content_hash(list(reversed(a))) != content_hash([{"key": "x", "sha256": "2"}])
    assert split_s3_uri("s3://b/a/b") == ("b", "a/b/") and split_s3_uri("s3://b") == ("b", "")
    with pytest.raises(ValueError):
        split_s3_uri("/local")


def test_digits_are_deterministic(tmp_path):
    from pcflow.dataset.digits import materialize_digits

    first = materialize_digits(tmp_path / "a")
    second = materialize_digits(tmp_path / "b")
    files = sorted(p.relative_to(first) for p in first.rglob("*.png"))
    assert len(files) == 1797 and {p.parts[0] for p in files} == {str(i) for i in range(10)}
    assert all((first / p).read_bytes() == (second / p).read_bytes() for p in files)
    assert (first / files[0]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    mtime = (first / files[0]).stat().st_mtime_ns
    materialize_digits(first)
    assert (first / files[0]).stat().st_mtime_ns == mtime, "a warm cache is left untouched"
