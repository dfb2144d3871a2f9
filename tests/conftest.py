"""Shared test plumbing: the local stack, started once when a test asks for it and stopped at the end
of the session when the session started it (a developer's running stack is left as it was)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STACK_SCRIPT = REPO / "include" / "local" / "stack.py"
ARTIFACTS = REPO / "tests" / "artifacts"


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


_STACK_WAS_UP = False


def pytest_sessionstart(session):
    global _STACK_WAS_UP  # noqa: PLW0603 - session-wide fact, read once at the end
    try:
        _STACK_WAS_UP = all(s["ready"] for s in stack_status().values())
    except Exception:  # no environment yet: nothing was up
        _STACK_WAS_UP = False


def pytest_sessionfinish(session, exitstatus):
    if not _STACK_WAS_UP and (REPO / ".stack" / "ports.json").exists():
        stack_cli("down")


@pytest.fixture(scope="session")
def local_stack() -> LocalStack:
    """The embedded default, up; its connections (`AIRFLOW_CONN_*`, AWS endpoint) in os.environ."""
    proc = stack_cli("up")
    if proc.returncode != 0:
        pytest.fail(f"local stack did not come up:\n{proc.stdout}\n{proc.stderr}")
    state_dir = Path(os.environ.get("PCFLOW_STACK_DIR", REPO / ".stack"))
    env = read_env_file(state_dir / "env")
    os.environ.update(env)
    os.environ.setdefault("AIRFLOW_HOME", str(state_dir / "airflow"))
    return LocalStack(state_dir=state_dir, env=env, ports=json.loads((state_dir / "ports.json").read_text()))


@pytest.fixture
def artifacts_dir(request) -> Path:
    """Where a test keeps what a person may want to look at afterwards (screenshots, reports)."""
    path = ARTIFACTS / request.node.name
    path.mkdir(parents=True, exist_ok=True)
    return path
