"""The local stack as tests see it: start/stop/status through stack.py, its env file, its endpoints."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STACK_SCRIPT = REPO / "include" / "local" / "stack.py"


def stack_cli(*args: str, state_dir: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if state_dir is not None:
        env["PCFLOW_STACK_DIR"] = str(state_dir)
    return subprocess.run(
        [sys.executable, str(STACK_SCRIPT), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )


def stack_status(state_dir: Path | None = None) -> dict[str, dict]:
    proc = stack_cli("status", "--json", state_dir=state_dir)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def read_env_file(path: Path) -> dict[str, str]:
    """KEY='value' lines as stack.py writes them (shell-quoted)."""
    env = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = shlex.split(value)[0] if value else ""
    return env


@dataclass(frozen=True)
class LocalStack:
    state_dir: Path
    env: dict[str, str]
    ports: dict[str, int]

    @property
    def slurm_connection(self) -> dict:
        return json.loads(self.env["AIRFLOW_CONN_SLURM_DEFAULT"])

    @property
    def shared_root(self) -> Path:
        return Path(self.slurm_connection["extra"]["shared_root"])
