"""Fixtures of the payload tests: the payload's own venv (built by its installer), the digits on the
stack's shared root."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from stacktools import REPO

PAYLOADS = REPO / "include" / "payloads"
SIMCLR = REPO / "examples" / "simclr"  # the profiles' payload (a payload root besides PAYLOADS)
INSTALLER = PAYLOADS / "install-payload-env.sh"
PAYLOAD_VENV = REPO / ".venv-payload"


@pytest.fixture(scope="session")
def payload_python() -> Path:
    """The payload venv's interpreter, installed (or confirmed, in well under a second) by its script."""
    proc = subprocess.run([str(INSTALLER), str(PAYLOAD_VENV)], capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0:
        pytest.fail(f"payload env install failed:\n{proc.stdout}\n{proc.stderr}")
    return PAYLOAD_VENV / "bin" / "python"
