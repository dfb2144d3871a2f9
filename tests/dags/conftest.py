"""The DAG tests' Airflow: the session's home with its metadata database, pcflow's folders, the payload."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from dagrun import REPO, airflow_environment, prepare_airflow


@pytest.fixture(scope="module")
def airflow(local_stack, tmp_path_factory):
    """The session's Airflow home with its metadata database (Airflow reads its home only once per
    process), pcflow's DAG and plugin folders, and the payload's environment."""
    home = Path(os.environ["AIRFLOW_HOME"])
    saved = dict(os.environ)
    os.environ.update(airflow_environment(home))
    os.environ["PCFLOW_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    prepare_airflow(home)
    subprocess.run(
        ["bash", str(REPO / "include/payloads/install-payload-env.sh"), str(REPO / ".venv-payload")], check=True
    )
    yield home
    os.environ.clear()
    os.environ.update(saved)
