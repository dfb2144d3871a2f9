"""Time to the first training batch, and read throughput over an epoch, for 1 GB of WebDataset shards:
streamed by the payload's reader (examples/simclr/shards.py) from a directory standing for the
FSx mount and straight from S3 (the moto server), against staged first (pcflow's stage-in copies the
partition into the cluster's shared directory, then the same reader reads the copy), in the same run.

Seed 002's Pipe mode let training start before the data was local; this measures what that buys.
The shards are written by the dataset stage's shard writer (shard_to_s3) from generated PNGs
(256x256 grey noise: incompressible, so 1 GB of shards is 1 GB to read) and deleted afterwards.
Each reading is a fresh process of the payload's venv, as a training job would start: time to the
first batch counts from its spawn (interpreter, torch and the reader's imports included) and, for the
staged peer, from the start of the copy. Throughput counts decoded images (and shard bytes) over
one epoch of one reader (world size 1, batches of 256).

Usage: .venv/bin/python benchmarks/first_batch.py [--gb 1.0]
Needs nothing running (it starts the local stack) but the payload venv (`make payload-env`);
prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAYLOAD_PYTHON = REPO / ".venv-payload" / "bin" / "python"
SIMCLR = REPO / "examples" / "simclr"
RESULTS = REPO / "benchmarks" / "results" / "first_batch.json"
GOAL = (
    "streamed (FSx mount dir and S3): first batch within 2 s of the job's start whatever the dataset's size, "
    "and epoch throughput at least 90% of reading the staged copy"
)
BATCH = 256
log = logging.getLogger("first_batch")


def read_epoch(data_dir: str) -> None:
    """Reader mode (in the payload venv): one epoch of `data_dir` through the payload's reader; one
    JSON line with the wall-clock times of its start (imports done), first batch and end."""
    sys.path.insert(0, str(SIMCLR))
    import shards  # noqa: F401  (torch, PIL, webdataset: imported before the clock starts)
    from data import open_dataset

    begin = time.time()
    data = open_dataset(data_dir, seed=0)
    steps = data.size // BATCH
    first = None
    images = 0
    for batch in data.batches(0, 0, 1, BATCH, steps):
        first = first or time.time()
        images += len(batch)
    end = time.time()
    print(json.dumps({"begin": begin, "first": first, "end": end, "images": images}))


def timed_reader(data_dir: str, staging_s: float = 0.0) -> dict:
    """A fresh payload process reads one epoch. first_batch_s: the data path's share of the job's start
    (`staging_s`, then from the reader's start to its first batch); the process's own start (interpreter,
    torch) is reported apart, as it is the same whatever the data."""
    spawned = time.time()
    proc = subprocess.run(
        [str(PAYLOAD_PYTHON), __file__, "--read", data_dir], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"reader of {data_dir} failed:\n{proc.stderr[-3000:]}")
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    epoch_s = got["end"] - got["begin"]
    return {
        "first_batch_s": round(staging_s + got["first"] - got["begin"], 3),
        "process_start_s": round(got["begin"] - spawned, 3),
        "epoch_s": round(epoch_s, 3),
        "images": got["images"],
        "images_per_s": round(got["images"] / epoch_s, 1),
    }


def raw_download_s(s3, bucket: str, root: str) -> float:
    """The emulator's own ceiling: every shard downloaded the same way (8 MiB ranges on 8 connections)
    into a sink that keeps nothing, no parsing, no decoding."""
    from boto3.s3.transfer import TransferConfig

    from pcflow.dataset.manifest import read_manifest

    class Discard:
        def write(self, data: bytes) -> int:
            return len(data)

    config = TransferConfig(multipart_chunksize=8 << 20, max_concurrency=8)
    started = time.monotonic()
    for entry in read_manifest(s3, bucket, root)["objects"]:
        s3.download_fileobj(bucket, root + entry["key"], Discard(), Config=config)
    return time.monotonic() - started


def make_source(root: Path, gigabytes: float) -> int:
    """PNGs of grey noise (256x256, stored uncompressed) in 10 class folders, about `gigabytes` in all."""
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    count = 0
    written = 0
    while written < gigabytes * 1e9:
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (256, 256), dtype=np.uint8), mode="L").save(buf, "PNG", compress_level=0)
        path = root / str(count % 10) / f"img_{count:06d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(buf.getvalue())
        written += len(buf.getvalue())
        count += 1
    return count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=1.0, help="dataset size in GB (default 1.0)")
    args = parser.parse_args()
    sys.path[:0] = [str(REPO / "plugins"), str(REPO / "tests"), str(REPO / "include" / "local")]
    os.environ.setdefault("AIRFLOW_HOME", str(REPO / ".stack" / "airflow"))
    from stacktools import start_for_script

    shared = start_for_script()

    from dagrun import delete_bucket

    from pcflow.aws.clients import aws_client
    from pcflow.dataset.shard import shard_to_s3
    from pcflow.dataset.stage_in import copy_partition
    from pcflow.slurm.hook import SlurmHook

    s3 = aws_client("s3")
    bucket = f"pcflow-bench-first-batch-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    work = shared / "bench" / f"first-batch-{uuid.uuid4().hex[:8]}"
    hook = SlurmHook()
    try:
        started = time.monotonic()
        images = make_source(work / "source", args.gb)
        generate_s = time.monotonic() - started
        started = time.monotonic()
        loaded = shard_to_s3(s3, str(work / "source"), bucket=bucket, prefix="ds", partition="bench")
        load_s = time.monotonic() - started
        shutil.rmtree(work / "source")

        staged_dir = work / "staged"
        copy_started = time.monotonic()
        copy_partition(s3, hook, bucket=bucket, root=loaded["root"], dest=str(staged_dir), log=log)
        copy_s = time.monotonic() - copy_started
        staged = {**timed_reader(str(staged_dir), staging_s=copy_s), "copy_s": round(copy_s, 3)}
        # What FSx shows the job is what the stage-in wrote: a directory of the manifest's objects and
        # the manifest. Streamed from it, the job starts reading at once instead of after the copy.
        mount = timed_reader(str(staged_dir))
        from_s3 = timed_reader(f"s3://{bucket}/{loaded['root']}")
        raw_s = raw_download_s(s3, bucket, loaded["root"])
    finally:
        hook.close()
        shutil.rmtree(work, ignore_errors=True)
        delete_bucket(s3, bucket)

    stream_ratio = {
        "mount": mount["images_per_s"] / staged["images_per_s"],
        "s3": from_s3["images_per_s"] / staged["images_per_s"],
    }
    result = {
        "benchmark": "first_batch",
        "metrics": {
            "images": images,
            "shards": loaded["object_count"],
            "shard_bytes": loaded["bytes"],
            "generate_s": round(generate_s, 1),
            "shard_load_s": round(load_s, 1),
            "streamed_from_mount": mount,
            "streamed_from_s3": from_s3,
            "throughput_vs_staged": {k: round(v, 3) for k, v in stream_ratio.items()},
        },
        "peers": {
            "staged: stage-in copy, then read": staged,
            "S3 download alone (the emulator's ceiling)": {
                "seconds": round(raw_s, 3),
                "mb_per_s": round(loaded["bytes"] / raw_s / 1e6, 1),
                "streamed_from_s3_mb_per_s": round(loaded["bytes"] / from_s3["epoch_s"] / 1e6, 1),
            },
        },
        "goal": GOAL,
        "goal_met": max(mount["first_batch_s"], from_s3["first_batch_s"]) <= 2.0 and min(stream_ratio.values()) >= 0.9,
    }
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--read":
        read_epoch(sys.argv[2])
        sys.exit(0)
    sys.exit(main())
