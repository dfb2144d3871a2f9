"""Shipping a run's own code to the cluster: pcflow's path (the git commit fetched alone, packed into one
content-addressed bundle by the .gitignore/.pcflowignore filter, put in the stack's bucket unless it is
there, staged once by one `tar -x` over SSH) against, in the same run on the local stack (moto over
HTTPS, the real sshd):

- `rsync -a` of the project directory to the head node over SSH, what SkyPilot does with a `workdir`
  (skypilot#1600: the `.git` directory goes too), and
- a SageMaker-style `sourcedir.tar.gz` of the whole directory uploaded to S3 for every job.

The project: 5,000 files, 50 MiB of text, in a git repository whose `.git` holds 200 MiB more (an
incompressible file committed and deleted in history, as a dataset or weights once committed by
mistake). Measured: the first delivery's time and bytes, and an unchanged re-run's.

Usage: .venv/bin/python benchmarks/code_shipping.py [--files 5000] [--mib 50] [--git-mib 200]
Needs nothing running (it starts the local stack); prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "plugins"), str(REPO / "tests")]
os.environ.setdefault("AIRFLOW_HOME", str(REPO / ".stack" / "airflow"))

from stacktools import start_for_script  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "code_shipping.json"
GOAL = (
    "an unchanged re-run moves 0 bytes and takes under 10 s; the first delivery sends less than rsync -a and "
    "the whole-directory tar.gz (no .git)"
)
WORDS = "def class return import self value for in range if else data model loss train step batch".split()
GIT_ENV = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b", "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@b"}
log = logging.getLogger("code_shipping")


def git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, env={**os.environ, **GIT_ENV}, check=True, capture_output=True)


def make_project(root: Path, files: int, mib: int, git_mib: int) -> None:
    """`files` text files adding up to `mib` MiB in 50 packages, committed; `git_mib` MiB of history."""
    rng = random.Random(26)
    size = (mib << 20) // files
    for i in range(files):
        path = root / f"pkg{i % 50:02d}" / f"mod{i:05d}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        words = []
        while sum(len(w) + 1 for w in words) < size:
            words.append(rng.choice(WORDS) if rng.random() < 0.7 else f"v{rng.getrandbits(32):x}")
        path.write_text(" ".join(words)[:size])
    git("init", "-q", "-b", "main", cwd=root)
    (root / "weights.bin").write_bytes(rng.randbytes(git_mib << 20))
    git("add", "-A", cwd=root)
    git("commit", "-qm", "project, and weights committed by mistake", cwd=root)
    (root / "weights.bin").unlink()
    git("commit", "-qam", "weights out", cwd=root)


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return round(time.perf_counter() - start, 3), result


def rsync(source: Path, dest: str, ssh: list[str], conn: dict) -> int:
    """`rsync -a` over SSH as SkyPilot runs it; the bytes it sent (its --stats)."""
    target = f"{conn['login']}@{conn['host']}:{dest}/"
    done = subprocess.run(
        ["rsync", "-a", "--stats", "-e", shlex.join(ssh), f"{source}/", target],
        check=False,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"rsync failed: {done.stderr}")
    return int(re.search(r"Total bytes sent: ([\d,]+)", done.stdout)[1].replace(",", ""))


def ssh_command(conn: dict, work: Path) -> list[str]:
    known = work / "known_hosts"
    known.write_text(f"[{conn['host']}]:{conn['port']} {conn['extra']['host_key']}\n")
    return [
        "ssh",
        "-p",
        str(conn["port"]),
        "-i",
        conn["extra"]["key_file"],
        "-o",
        f"UserKnownHostsFile={known}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "IdentitiesOnly=yes",
    ]


def sagemaker_style(s3, bucket: str, source: Path, job: str) -> int:
    """The whole directory as sourcedir.tar.gz, uploaded for this job; the bytes uploaded."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(source, arcname=".")
    s3.put_object(Bucket=bucket, Key=f"{job}/source/sourcedir.tar.gz", Body=buffer.getvalue())
    return buffer.tell()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--mib", type=int, default=50)
    parser.add_argument("--git-mib", type=int, default=200)
    args = parser.parse_args()
    if shutil.which("rsync") is None:
        raise SystemExit("rsync is not installed: include/local/install-system-packages.sh installs it")

    shared = start_for_script()
    conn = json.loads(os.environ["AIRFLOW_CONN_SLURM_DEFAULT"])

    from pcflow.aws.clients import aws_client
    from pcflow.code.deliver import deliver, pin_code
    from pcflow.slurm.hook import SlurmHook

    s3 = aws_client("s3")
    bucket = f"pcflow-bench-code-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    tmp = Path(tempfile.mkdtemp(prefix="pcflow-bench-code-"))
    project = tmp / "project"
    project.mkdir()
    make_project(project, args.files, args.mib, args.git_mib)
    tree_bytes, git_bytes = du(project) - du(project / ".git"), du(project / ".git")
    work = shared / "bench" / f"code-{uuid.uuid4().hex[:8]}"
    run = {
        "stack": "bench",
        "dataset": {"bucket": bucket},
        "training": {
            "code": {"git": {"url": f"file://{project}", "ref": "main"}},
            "bundle": {"max_mib": args.mib + 14, "allow_secrets": False},
        },
    }
    hook = SlurmHook()
    try:
        pin_s, _ = timed(lambda: pin_code(run, str))
        first_s, first = timed(lambda: deliver(run, hook, shared_root=str(work / "pcflow"), s3=s3, log=log))
        rerun_s, rerun = timed(lambda: deliver(run, hook, shared_root=str(work / "pcflow"), s3=s3, log=log))
        assert first["files"] == args.files and rerun["reused"] and rerun["uploaded_bytes"] == 0
        ssh = ssh_command(conn, tmp)
        hook.makedirs(str(work / "rsync"))
        rsync_s, rsync_bytes = timed(lambda: rsync(project, str(work / "rsync"), ssh, conn))
        rsync_rerun_s, rsync_rerun_bytes = timed(lambda: rsync(project, str(work / "rsync"), ssh, conn))
        tar_s, tar_bytes = timed(lambda: sagemaker_style(s3, bucket, project, "job-1"))
        tar_rerun_s, tar_rerun_bytes = timed(lambda: sagemaker_style(s3, bucket, project, "job-2"))
    finally:
        hook.run(["chmod", "-R", "u+w", str(work)], check=False)
        hook.run(["rm", "-rf", str(work)], check=False)
        hook.close()
        shutil.rmtree(tmp, ignore_errors=True)
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for obj in page.get("Contents", []):
                s3.delete_object(Bucket=bucket, Key=obj["Key"])
        s3.delete_bucket(Bucket=bucket)

    result = {
        "benchmark": "code_shipping",
        "metrics": {
            "project_files": args.files,
            "project_bytes": tree_bytes,
            "git_dir_bytes": git_bytes,
            "resolve_ref_s": pin_s,
            "first_s": first_s,
            "first_uploaded_bytes": first["uploaded_bytes"],
            "bundle_bytes": first["bytes"],
            "rerun_s": rerun_s,
            "rerun_uploaded_bytes": rerun["uploaded_bytes"],
            "rerun_reused": rerun["reused"],
        },
        "peers": {
            "rsync -a (SkyPilot workdir)": {
                "first_s": rsync_s,
                "first_bytes": rsync_bytes,
                "rerun_s": rsync_rerun_s,
                "rerun_bytes": rsync_rerun_bytes,
            },
            "tar.gz per job (SageMaker source_dir)": {
                "first_s": tar_s,
                "first_bytes": tar_bytes,
                "rerun_s": tar_rerun_s,
                "rerun_bytes": tar_rerun_bytes,
            },
        },
        "goal": GOAL,
        "goal_met": rerun["uploaded_bytes"] == 0 and rerun_s < 10 and first["bytes"] < min(rsync_bytes, tar_bytes),
    }
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
