"""The payload's pure parts (augmentations, NT-Xent, checkpoints, metrics lines, ...), checked in the
payload's own venv: the Airflow venv has no torch. One subprocess runs every check; each is reported
as its own test."""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

import pytest

CHECKS_FILE = Path(__file__).with_name("payload_checks.py")
CHECK_NAMES = [
    node.name
    for node in ast.parse(CHECKS_FILE.read_text()).body
    if isinstance(node, ast.FunctionDef) and node.name.startswith("check_")
]


@pytest.fixture(scope="module")
def check_results(payload_python: Path) -> dict[str, str | None]:
    proc = subprocess.run(
        [str(payload_python), str(CHECKS_FILE)], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", CHECK_NAMES)
def test_payload_part(name: str, check_results: dict[str, str | None]):
    assert name in check_results, f"{name} did not run"
    if check_results[name] is not None:
        pytest.fail(f"{name} failed in the payload venv:\n{check_results[name]}", pytrace=False)
