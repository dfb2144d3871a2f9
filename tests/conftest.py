"""Shared test plumbing: the local stack, started once when a test asks for it and stopped at the end
of the session when the session started it (a developer's running stack is left as it was)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from stacktools import REPO, LocalStack, read_env_file, stack_cli, stack_status

ARTIFACTS = REPO / "tests" / "artifacts"


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
