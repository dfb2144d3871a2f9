"""Real Airflow services for tests, without Docker: a private PostgreSQL cluster (initdb/pg_ctl in a temp
dir on a loopback port, never the system service) and the api-server, scheduler, dag-processor and
triggerer as separate processes on it. Each process is started here and stopped here, by its pid."""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from dagrun import POOLS_FILE

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def postgres_bin() -> Path | None:
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name)):
        if Path(candidate, "initdb").exists():
            return Path(candidate)
    found = shutil.which("initdb")
    return Path(found).resolve().parent if found else None


def install_postgres() -> Path | None:
    """Debian's package, installed when missing and we are root (as include/local/install-system-packages.sh)."""
    if postgres_bin() is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=False, timeout=300)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "postgresql"],
            env=env,
            check=True,
            timeout=600,
        )
    return postgres_bin()


class Postgres:
    """A private cluster: `airflow` superuser, trust auth on 127.0.0.1 only, database `airflow`."""

    def __init__(self, root: Path, bindir: Path):
        self.root, self.bindir, self.port = root, bindir, free_port()
        self.data = root / "data"
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def run(self, *argv: str, timeout: float = 120) -> None:
        subprocess.run([*self.as_user, *argv], check=True, timeout=timeout, capture_output=True)

    def start(self) -> str:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.as_user:
            shutil.chown(self.root, "postgres", "postgres")
        self.run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", "airflow", "--auth=trust", "-E", "UTF8")
        options = f"-p {self.port} -h 127.0.0.1 -k {self.root} -c max_connections=200"
        self.run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.root / "log"),
            "-o",
            options,
            "-w",
            "start",
        )
        self.run(str(self.bindir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "airflow", "airflow")
        return f"postgresql+psycopg2://airflow@127.0.0.1:{self.port}/airflow"

    def stop(self) -> None:
        subprocess.run(
            [*self.as_user, str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"],
            check=False,
            timeout=60,
            capture_output=True,
        )


class AirflowServices:
    """api-server, scheduler, dag-processor, triggerer on one metadata DB; LocalExecutor."""

    COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")

    def __init__(self, home: Path, sql_alchemy_conn: str, extra_env: dict[str, str], parallelism: int = 2):
        from cryptography.fernet import Fernet

        self.home, self.port = home, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.procs: dict[str, subprocess.Popen] = {}
        self.env = {
            **os.environ,
            **extra_env,
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "false",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": str(parallelism),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "true",
            "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API_AUTH__JWT_SECRET": os.urandom(16).hex(),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": sql_alchemy_conn,
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
            "AIRFLOW__TRIGGERER__DEFAULT_CAPACITY": "100",
            "PYTHONPATH": os.pathsep.join([str(REPO / "plugins"), os.environ.get("PYTHONPATH", "")]),
        }
        self.token: str | None = None

    def airflow(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(BIN / "airflow"), *args], env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        migrated = self.airflow("db", "migrate")
        assert migrated.returncode == 0, migrated.stdout[-3000:] + migrated.stderr[-3000:]
        pools = self.airflow("pools", "import", str(POOLS_FILE))  # the pipeline's cluster and train tasks use them
        assert pools.returncode == 0, pools.stdout[-3000:] + pools.stderr[-3000:]
        for name in self.COMPONENTS:
            argv = [str(BIN / "airflow"), name] + (["--port", str(self.port)] if name == "api-server" else [])
            log = open(self.home / f"{name}.log", "wb")  # the process owns it until stop()
            self.procs[name] = subprocess.Popen(
                argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.wait_healthy()
        self.token = json.loads(self.request("GET", "/auth/token", auth=False))["access_token"]

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)  # the session this fixture started for it
        deadline = time.monotonic() + 30
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    def log_tail(self, name: str, lines: int = 40) -> str:
        return "\n".join((self.home / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])

    def wait_healthy(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                assert proc.poll() is None, f"{name} exited:\n{self.log_tail(name)}"
            try:
                health = json.loads(self.request("GET", "/api/v2/monitor/health", auth=False))
                states = {k: (v or {}).get("status") for k, v in health.items()}
                if all(states.get(k) == "healthy" for k in ("metadatabase", "scheduler", "triggerer", "dag_processor")):
                    return
            except (OSError, urllib.error.URLError, ValueError):
                pass
            time.sleep(2)
        raise AssertionError(f"services not healthy in {timeout}s:\n{self.log_tail('api-server')}")

    def request(self, method: str, path: str, body: dict | None = None, auth: bool = True) -> str:
        headers = {"Content-Type": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.token}"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        with urllib.request.urlopen(req, timeout=30) as response:
            return response.read().decode()

    def api(self, method: str, path: str, body: dict | None = None) -> dict:
        return json.loads(self.request(method, "/api/v2" + path, body))
