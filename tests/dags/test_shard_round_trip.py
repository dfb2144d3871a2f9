"""Shards round trip: `pretrain` with the dataset stage in `shard` mode (the aws-gpu profile's) on the
embedded default: the digits packed into WebDataset tar shards in S3, staged with their manifest, and
the payload trains on them streamed, nothing unpacked to disk."""

from __future__ import annotations

from pathlib import Path

from dagrun import remove_stack, run_dag, tagged_resources

CONF = {"partition": "shards", "overrides": {"dataset": {"mode": "shard"}}, "hyperparameters": {"epochs": 1}}


def test_pretrain_trains_on_the_shards_the_dataset_stage_wrote(airflow):
    result = run_dag("pretrain", CONF)
    assert result.state == "success", result.task_states
    out = result.returned
    assert out["dataset"]["mode"] == "shard" and out["dataset"]["samples"] == 1797
    data_dir = Path(out["stage_in"])  # the shared root is local in the embedded stack
    names = sorted(p.name for p in data_dir.rglob("*") if p.is_file())
    shards = [name for name in names if name.endswith(".tar")]
    assert names == ["manifest.json", *shards], "the manifest and its shards, nothing unpacked"
    assert len(shards) == out["dataset"]["object_count"]

    log = Path(out["train"]["log"]).read_text()
    assert "1797 images, 10 classes" in log and "(ShardDataset)" in log
    finals = out["metrics"]["metrics"]
    assert finals["probe_accuracy"]["final"] > 0.5 and "fewshot_accuracy_untrained" in finals
    assert tagged_resources("pcflow:run", result.run_key) == []
    assert remove_stack("local") == []  # what the run keeps on purpose (image, data bucket)
