"""The compose file's resolved model (include/local/compose_model.py, which `make airflow` runs from),
with the `.env` the tests fill in: every password the awkward one a user may well choose."""

from __future__ import annotations

from pathlib import Path

import compose_model
from compose_model import COMPOSE_FILE, REPO, ComposeRefused, Project, Service, compose_binary, run_config

__all__ = ["COMPOSE_FILE", "REPO", "ComposeRefused", "Project", "Service", "compose_binary", "run_config"]

#: A password a user may well choose: every character that has a meaning in a URL, and a space.
AWKWARD_PASSWORD = "p@ss:w/rd?#%&+= 1"


def fill_env_file(path: Path, **options) -> Path:
    """compose_model.fill_env_file, every password AWKWARD_PASSWORD."""
    return compose_model.fill_env_file(path, password=AWKWARD_PASSWORD, **options)
