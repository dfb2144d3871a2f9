"""Staging a loaded partition into a static cluster's shared directory: pcflow's `copy_partition` (one
`tar -x` fed over SSH from parallel S3 reads) against the Amazon provider's `S3ToSFTPOperator` with
`s3_filenames="*"` (per object: HeadObject, download to a temporary file, SFTP put, stat), measured
in the same run on the local stack (moto over HTTPS, the real sshd) with the same 1,797 digits.

Usage: .venv/bin/python benchmarks/stage_in.py [--repeat 3]
Needs nothing running (it starts the local stack); prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "plugins"), str(REPO / "tests")]
os.environ.setdefault("AIRFLOW_HOME", str(REPO / ".stack" / "airflow"))

from stacktools import start_for_script  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "stage_in.json"
GOAL = "pcflow stages the 1,797 digits at least 5x faster than S3ToSFTPOperator, and a re-run copies nothing"
log = logging.getLogger("stage_in")


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    shared = start_for_script()

    from airflow.providers.amazon.aws.transfers.s3_to_sftp import S3ToSFTPOperator

    from pcflow.aws.clients import aws_client
    from pcflow.dataset.digits import materialize_digits
    from pcflow.dataset.stage_in import copy_partition
    from pcflow.dataset.sync import sync_to_s3
    from pcflow.slurm.hook import SlurmHook

    s3 = aws_client("s3")
    bucket = f"pcflow-bench-stage-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    source = materialize_digits(REPO / ".stack" / "bench" / "digits")
    loaded = sync_to_s3(s3, str(source), bucket=bucket, prefix="ds", partition="bench")
    root = loaded["root"]
    expected = tree(source)
    work = shared / "bench" / f"stage-{uuid.uuid4().hex[:8]}"
    hook = SlurmHook()
    pcflow_s, peer_s = [], []
    try:
        for i in range(args.repeat):
            dest = work / f"pcflow-{i}"
            seconds, counts = timed(
                lambda dest=dest: copy_partition(s3, hook, bucket=bucket, root=root, dest=str(dest), log=log)
            )
            assert counts["copied"] == len(expected) and tree(dest) == expected, "pcflow's copy differs"
            pcflow_s.append(seconds)

            peer_dest = work / f"peer-{i}"
            for rel in expected:  # the operator makes no directories: made here, outside the timing
                (peer_dest / rel).parent.mkdir(parents=True, exist_ok=True)
            peer = S3ToSFTPOperator(
                task_id=f"peer-{i}",
                s3_bucket=bucket,
                s3_key=root,
                s3_filenames="*",
                sftp_path=f"{peer_dest}/",
                sftp_conn_id="slurm_default",
            )
            seconds, _ = timed(lambda peer=peer: peer.execute({}))
            got = tree(peer_dest)  # it lists the prefix, so it also copies manifest.json: one file more
            assert {k: got.get(k) for k in expected} == expected, "S3ToSFTPOperator's copy differs"
            peer_s.append(seconds)
        rerun_s, rerun = timed(
            lambda: copy_partition(s3, hook, bucket=bucket, root=root, dest=str(work / "pcflow-0"), log=log)
        )
    finally:
        hook.close()
        shutil.rmtree(work, ignore_errors=True)
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for obj in page.get("Contents", []):
                s3.delete_object(Bucket=bucket, Key=obj["Key"])
        s3.delete_bucket(Bucket=bucket)

    pcflow, peer = statistics.median(pcflow_s), statistics.median(peer_s)
    result = {
        "benchmark": "stage_in",
        "metrics": {
            "files": len(expected),
            "bytes": sum(len(b) for b in expected.values()),
            "pcflow_s": round(pcflow, 3),
            "pcflow_runs_s": [round(s, 3) for s in pcflow_s],
            "speedup_vs_s3_to_sftp": round(peer / pcflow, 1),
            "rerun_s": round(rerun_s, 3),
            "rerun_copied": rerun["copied"],
        },
        "peers": {"S3ToSFTPOperator": {"median_s": round(peer, 3), "runs_s": [round(s, 3) for s in peer_s]}},
        "goal": GOAL,
        "goal_met": peer / pcflow >= 5 and rerun["copied"] == 0,
    }
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
