#!/usr/bin/env python3
"""pcflow utilisation sampler: one per node of a Slurm job, started in the background by the batch
wrapper (`srun --overlap`), appending one JSON line per interval to `$PCFLOW_RUN_DIR/utilisation.jsonl`
every `$UTILISATION_INTERVAL_S` seconds (default 5; the first sample after one second):

    {"time": 1767000000.0, "host": "gpu-st-1", "cpu_percent": 71.5, "cpus": 96,
     "mem_used_mb": 81234, "mem_total_mb": 786432,
     "gpus": [{"index": 0, "util": 93, "mem_used_mb": 30100, "mem_total_mb": 40960}, ...]}

`gpus` is present only where nvidia-smi answers. Standard library only (it runs with the node's own
python3), no dependencies on the job's environment; it exits on SIGTERM (the wrapper's `kill`, or
Slurm ending the job's steps) and never makes the job fail: every error is written to stderr only.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

NVIDIA_QUERY = "index,utilization.gpu,memory.used,memory.total"


def cpu_times():
    """(busy, total) jiffies of the whole node from /proc/stat."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def memory_mb():
    """(used, total) MiB of the node from /proc/meminfo; "used" leaves out what the kernel could reclaim
    (MemAvailable)."""
    info = {}
    with open("/proc/meminfo") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            info[key] = int(rest.split()[0]) // 1024
    return info["MemTotal"] - info.get("MemAvailable", info.get("MemFree", 0)), info["MemTotal"]


def gpus(nvidia_smi):
    """One record per GPU from nvidia-smi, None without one; a failing nvidia-smi is reported on stderr, never
    to the job."""
    if not nvidia_smi:
        return None
    try:
        out = subprocess.run(
            [nvidia_smi, "--query-gpu=" + NVIDIA_QUERY, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"pcflow sampler: nvidia-smi failed: {exc}", file=sys.stderr)
        return None
    found = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        try:
            found.append(
                {
                    "index": int(parts[0]),
                    "util": float(parts[1]),
                    "mem_used_mb": float(parts[2]),
                    "mem_total_mb": float(parts[3]),
                }
            )
        except ValueError:
            continue  # "[N/A]" on some boards
    return found


def main():
    """Sample every interval until SIGTERM, appending one line per sample; an error skips a sample, never ends
    the job."""
    run_dir = os.environ.get("PCFLOW_RUN_DIR") or "."
    path = os.environ.get("PCFLOW_UTILISATION_FILE") or os.path.join(run_dir, "utilisation.jsonl")
    interval = max(0.5, float(os.environ.get("UTILISATION_INTERVAL_S") or 5))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    host = socket.gethostname()
    nvidia_smi = shutil.which("nvidia-smi")
    cpus = os.cpu_count()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    before = cpu_times()
    delay = min(1.0, interval)  # a first sample soon, so that short jobs have one too
    while True:
        time.sleep(delay)
        delay = interval
        try:
            now = cpu_times()
            busy, total = now[0] - before[0], now[1] - before[1]
            before = now
            used, mem_total = memory_mb()
            record = {
                "time": round(time.time(), 3),
                "host": host,
                "cpus": cpus,
                "cpu_percent": round(100.0 * busy / total, 2) if total else 0.0,
                "mem_used_mb": used,
                "mem_total_mb": mem_total,
            }
            found = gpus(nvidia_smi)
            if found is not None:
                record["gpus"] = found
            # One write of one whole line on an O_APPEND descriptor: nodes never interleave lines.
            os.write(fd, (json.dumps(record) + "\n").encode())
        except (OSError, ValueError, KeyError) as exc:
            print(f"pcflow sampler: {exc}", file=sys.stderr)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        pass
