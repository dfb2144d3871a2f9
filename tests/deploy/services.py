"""What the deployment tests need on the host before include/local/airflow_services.py (which runs
docker-compose.yaml's services natively, for them and for `make airflow`) can start: PostgreSQL and
Redis, installed from Debian's packages when we are root and they are missing (as
include/local/install-system-packages.sh does)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from airflow_services import postgres_bin


def apt_install(package: str) -> None:
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], env=env, check=False, timeout=300)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", package], env=env, check=True, timeout=600
    )


def install_postgres() -> Path | None:
    if postgres_bin() is None:
        apt_install("postgresql")
    return postgres_bin()


def install_redis() -> str | None:
    if shutil.which("redis-server") is None:
        apt_install("redis-server")
    return shutil.which("redis-server")
