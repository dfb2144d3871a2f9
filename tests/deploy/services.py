"""docker-compose.yaml's default services as processes on this host (there is no container engine): a
private PostgreSQL cluster (initdb/pg_ctl in a temp dir on a loopback port, never the system service) and
a private Redis stand in for the `postgres` and `redis` containers, configured from their compose
services; airflow-init, the api-server, scheduler, dag-processor, Celery workers and triggerers run with
the environment, command and mounts Compose resolves for their services (tests/deploy/compose.py), on
the image's layout (tests/deploy/image.py: pcflow from the wheel installed where the Dockerfile installs
it, the image's ENV). Each replica gets its own Airflow home and hostname (a UTS namespace), as a
container would. Each process is started here and stopped here, by its pid."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from deploy.compose import Project, Service
from deploy.image import BASE_AIRFLOW_HOME, BIN, Image

#: The official image's AIRFLOW_HOME, under which compose mounts dags/, plugins/, include/ and the logs.
IMAGE_AIRFLOW_HOME = BASE_AIRFLOW_HOME
#: Settings of the test deployment that the compose file leaves at Airflow's defaults, lowered so that a
#: failover takes seconds instead of minutes on this 2-core machine (nothing else differs from compose):
TEST_SETTINGS = {
    # A task whose worker died is failed (then retried) once its heartbeat is this old: the task's
    # supervisor heartbeats every 5 s ([workers] min_heartbeat_interval); the default waits 300 s.
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "20",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "2",
    # A triggerer whose heartbeat (every job_heartbeat_sec, default 5) is older than the threshold
    # (default 30 s) is dead: another triggerer takes its triggers over.
    "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "2",
    "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "10",
    "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
    # The tests trigger every run themselves (a sweep, a backfill): unpausing the nightly DAG must not
    # also start last night's run of its own schedule.
    "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
    "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
    # Sized for 2 cores: one API worker process, 4 task slots per Celery worker (default 4 and 16).
    "AIRFLOW__API__WORKERS": "1",
    "AIRFLOW__CELERY__WORKER_CONCURRENCY": "4",
}
#: Ports a process listens on inside its own container; here each replica gets a free one instead.
PRIVATE_PORTS = {
    "airflow-worker": "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT",
    "airflow-triggerer": "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT",
    "airflow-scheduler": "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT",
}
#: A URL's scheme -> the port it means when it names none.
DEFAULT_PORTS = {"postgresql": 5432, "redis": 6379, "http": 80, "https": 443}
URL = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<user>[^@/?#]*@)?(?P<host>[A-Za-z0-9_.-]+)(?::(?P<port>\d+))?"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def apt_install(package: str) -> None:
    """Debian's package, when we are root (as include/local/install-system-packages.sh does)."""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], env=env, check=False, timeout=300)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", package], env=env, check=True, timeout=600
    )


def postgres_bin() -> Path | None:
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name)):
        if Path(candidate, "initdb").exists():
            return Path(candidate)
    found = shutil.which("initdb")
    return Path(found).resolve().parent if found else None


def install_postgres() -> Path | None:
    if postgres_bin() is None:
        apt_install("postgresql")
    return postgres_bin()


def install_redis() -> str | None:
    if shutil.which("redis-server") is None:
        apt_install("redis-server")
    return shutil.which("redis-server")


class Postgres:
    """A private cluster as compose's `postgres` service is configured (POSTGRES_USER, _PASSWORD, _DB):
    password (scram) authentication on 127.0.0.1, the local socket in its own directory."""

    def __init__(self, bindir: Path, service: Service):
        env = service.environment
        self.user, self.password, self.database = env["POSTGRES_USER"], env["POSTGRES_PASSWORD"], env["POSTGRES_DB"]
        # Its own top directory: the server runs as `postgres`, which must reach it.
        self.root, self.bindir, self.port = Path(tempfile.mkdtemp(prefix="pcflow-pg-")), bindir, free_port()
        self.data = self.root / "data"
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def run(self, *argv: str, timeout: float = 120) -> None:
        proc = subprocess.run([*self.as_user, *argv], timeout=timeout, capture_output=True, text=True, check=False)
        assert proc.returncode == 0, f"{argv[0]} failed: {proc.stdout}{proc.stderr}"

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.as_user:
            shutil.chown(self.root, "postgres", "postgres")
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.password + "\n")
        if self.as_user:
            shutil.chown(pwfile, "postgres", "postgres")
        pwfile.chmod(0o600)
        initdb = [str(self.bindir / "initdb"), "-D", str(self.data), "-U", self.user, "-E", "UTF8"]
        self.run(*initdb, "--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}")
        pwfile.unlink()
        options = f"-p {self.port} -h 127.0.0.1 -k {self.root} -c max_connections=300"
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
        self.run(
            str(self.bindir / "createdb"), "-h", str(self.root), "-p", str(self.port), "-U", self.user, self.database
        )

    def stop(self) -> None:
        subprocess.run(
            [*self.as_user, str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"],
            check=False,
            timeout=60,
            capture_output=True,
        )
        shutil.rmtree(self.root, ignore_errors=True)


class Redis:
    """A private redis-server on a loopback port, nothing persisted (compose's `redis` keeps no volume)."""

    def __init__(self, root: Path, executable: str):
        self.root, self.executable, self.port = root, executable, free_port()
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        argv = [self.executable, "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.root)]
        argv += ["--save", "", "--appendonly", "no", "--protected-mode", "yes", "--daemonize", "no"]
        log = open(self.root / "redis.log", "wb")  # the process owns it until stop()
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            assert self.proc.poll() is None, (self.root / "redis.log").read_text()
            time.sleep(0.2)
        raise AssertionError("redis-server did not listen in 30 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


class Container:
    """What one replica of a compose service sees, mapped onto this host: its own Airflow home, the
    service's bind mounts (host paths) and named volumes (one directory per volume, shared by every
    replica that mounts it), and the other services reached by their compose names on loopback ports."""

    def __init__(self, service: Service, name: str, root: Path, endpoints: dict[tuple[str, int], int]):
        self.service, self.name, self.endpoints = service, name, endpoints
        self.home = root / "homes" / name
        self.mounts: dict[str, Path] = {}
        for target, (kind, source) in service.mounts.items():
            self.mounts[target] = Path(source) if kind == "bind" else root / "volumes" / source
            self.mounts[target].mkdir(parents=True, exist_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)
        for target, path in self.mounts.items():  # mounts under the image's AIRFLOW_HOME appear there
            link = self.home / target.removeprefix(IMAGE_AIRFLOW_HOME + "/")
            if target.startswith(IMAGE_AIRFLOW_HOME + "/") and not link.exists():
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(path)

    def path(self, value: str) -> str:
        """A container path on this host (longest mount first; then the image's AIRFLOW_HOME)."""
        for target in sorted(self.mounts, key=len, reverse=True):
            if value == target or value.startswith(target + "/"):
                return str(self.mounts[target]) + value[len(target) :]
        if value == IMAGE_AIRFLOW_HOME or value.startswith(IMAGE_AIRFLOW_HOME + "/"):
            return str(self.home) + value[len(IMAGE_AIRFLOW_HOME) :]
        return value

    def url(self, value: str) -> str:
        """URLs naming a compose service point at the loopback port that stands for it here."""

        def swap(match: re.Match) -> str:
            # postgresql+psycopg2, db+postgresql (Celery's result backend): the database's part names the port.
            default = next((DEFAULT_PORTS[p] for p in match["scheme"].split("+") if p in DEFAULT_PORTS), 0)
            port = int(match["port"] or default)
            local = self.endpoints.get((match["host"], port))
            if local is None:
                return match[0]
            return f"{match['scheme']}://{match['user'] or ''}127.0.0.1:{local}"

        return URL.sub(swap, value)

    def environment(self, base: dict[str, str]) -> dict[str, str]:
        env = {k: self.url(self.path(v)) for k, v in self.service.environment.items()}
        return {**base, **env, "AIRFLOW_HOME": str(self.home), "HOME": str(self.home), "HOSTNAME": self.name}

    def argv(self) -> list[str]:
        argv = [self.path(a) for a in self.service.argv]
        if argv[0] == "airflow":
            argv[0] = str(BIN / "airflow")
        return argv


class Deployment:
    """The default services of docker-compose.yaml, up: postgres, redis, airflow-init (run to its end),
    api-server, scheduler, dag-processor, `workers` Celery workers and `triggerers` triggerers."""

    def __init__(self, project: Project, root: Path, image: Image, *, workers: int = 2, triggerers: int = 2):
        self.project, self.root, self.image = project, root, image
        self.replicas = {
            "airflow-apiserver": 1,
            "airflow-scheduler": 1,
            "airflow-dag-processor": 1,
            "airflow-worker": workers,
            "airflow-triggerer": triggerers,
        }
        self.procs: dict[str, subprocess.Popen] = {}
        self.api_port = free_port()
        self.url = f"http://127.0.0.1:{self.api_port}"
        self.postgres: Postgres | None = None
        self.redis: Redis | None = None
        self.token: str | None = None
        self.timings: dict[str, float] = {}
        init = project.services["airflow-init"].environment
        self.username, self.password = init["_AIRFLOW_WWW_USER_USERNAME"], init["_AIRFLOW_WWW_USER_PASSWORD"]

    # -- what every process gets besides its compose environment -------------------------------------
    def base_environment(self) -> dict[str, str]:
        """The image's own environment (pcflow from its wheel, its ENV), and nothing of this test
        process's (no AIRFLOW_*, no AWS_*, no connections: those come from compose)."""
        return self.image.environment()

    def endpoints(self) -> dict[tuple[str, int], int]:
        ports = {("postgres", 5432): self.postgres, ("redis", 6379): self.redis}
        return {**{key: server.port for key, server in ports.items()}, ("airflow-apiserver", 8080): self.api_port}

    def container(self, service: str, name: str) -> Container:
        return Container(self.project.services[service], name, self.root, self.endpoints())

    def environment(self, container: Container, service: str) -> dict[str, str]:
        env = {**container.environment(self.base_environment()), **TEST_SETTINGS}
        if service in PRIVATE_PORTS:
            env[PRIVATE_PORTS[service]] = str(free_port())
        return env

    # -- lifecycle ----------------------------------------------------------------------------------------
    def start(self, postgres_bindir: Path, redis_server: str) -> None:
        self.postgres = Postgres(postgres_bindir, self.project.services["postgres"])
        self.postgres.start()
        self.redis = Redis(self.root / "redis", redis_server)
        self.redis.start()
        started = time.monotonic()
        init = self.run_once("airflow-init")
        assert init.returncode == 0, f"airflow-init failed:\n{init.stdout[-3000:]}\n{init.stderr[-5000:]}"
        self.timings["airflow-init"] = time.monotonic() - started
        for service, count in self.replicas.items():
            for index in range(1, count + 1):
                self.spawn(service, f"{service}-{index}")
        self.wait_healthy()
        self.token = self.login()
        self.timings["services healthy"] = time.monotonic() - started - self.timings["airflow-init"]

    def run_once(self, service: str, **overrides: str) -> subprocess.CompletedProcess:
        container = self.container(service, f"{service}-1")
        env = {**self.environment(container, service), **overrides}
        return subprocess.run(container.argv(), env=env, capture_output=True, text=True, timeout=600, check=False)

    def spawn(self, service: str, name: str) -> None:
        """One replica, in its own UTS namespace named after it (its hostname, as a container's)."""
        container = self.container(service, name)
        argv = container.argv()
        if service == "airflow-apiserver":
            argv += ["--port", str(self.api_port)]  # the host side of compose's ports mapping
        wrapped = ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', name, *argv]
        log = open(self.root / f"{name}.log", "wb")  # the process owns it until stop()
        env = self.environment(container, service)
        self.procs[name] = subprocess.Popen(
            wrapped, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def kill(self, name: str) -> None:
        """SIGKILL a replica and every process it started (a container lost with its host)."""
        import psutil

        proc = self.procs[name]
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        for member in family:
            member.kill()
        psutil.wait_procs(family, timeout=30)
        proc.wait(timeout=10)

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
        if self.redis is not None:
            self.redis.stop()
        if self.postgres is not None:
            self.postgres.stop()

    # -- health and the REST API --------------------------------------------------------------------------
    def log_tail(self, name: str, lines: int = 40) -> str:
        return "\n".join((self.root / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])

    def wait_healthy(self, timeout: float = 240) -> None:
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
        raise AssertionError(f"services not healthy in {timeout}s:\n{self.log_tail('airflow-apiserver-1')}")

    def login(self) -> str:
        """The first user airflow-init created, logging in to the FAB auth manager for an API token."""
        body = {"username": self.username, "password": self.password}
        return json.loads(self.request("POST", "/auth/token", body, auth=False))["access_token"]

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

    def airflow(
        self, *args: str, service: str = "airflow-scheduler", timeout: float = 300
    ) -> subprocess.CompletedProcess:
        """The `airflow` CLI run as `docker compose exec <service> airflow ...` would run it."""
        container = self.container(service, f"{service}-cli")
        env = self.environment(container, service)
        argv = [str(BIN / "airflow"), *args]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=False)
