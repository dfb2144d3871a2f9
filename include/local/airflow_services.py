"""docker-compose.yaml's default services as processes on this host (no container engine): a private
PostgreSQL cluster (initdb/pg_ctl in its own directory on a loopback port, never the system service) and
a private Redis stand in for the `postgres` and `redis` containers, configured from their compose
services; airflow-init, the api-server, scheduler, dag-processor, Celery workers and triggerers run with
the environment, command and mounts Compose resolves for their services (compose_model.py). Each
replica gets its own Airflow home and hostname (a UTS namespace), as a container would.

Everything lives under one directory: the `.env` compose reads, `deployment.json` (ports and replica
counts, chosen once), the processes' pid records (pid + kernel start time, so a later command finds
them again and stops exactly those), logs, homes, volumes and the database. `make airflow`
(airflow_ui.py) and tests/deploy/test_celery_deployment.py start the deployment through this module."""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from compose_model import Project, Service
from stack import alive, start_time, write_if_changed

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
#: The official image's AIRFLOW_HOME, under which compose mounts dags/, plugins/, include/ and the logs.
IMAGE_AIRFLOW_HOME = "/opt/airflow"
#: Airflow settings for one small machine, which a `.env` of this deployment carries (compose passes its
#: lines to every service): one API worker process, 4 task slots per Celery worker (default 4 and 16).
ONE_MACHINE_SETTINGS = {"AIRFLOW__API__WORKERS": "1", "AIRFLOW__CELERY__WORKER_CONCURRENCY": "4"}
#: Settings the compose file leaves at Airflow's defaults, lowered in this deployment's `.env` (as a user
#: tunes theirs) so that a failover takes seconds instead of minutes on a 2-core machine:
FAILOVER_SETTINGS = {
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
}
#: Ports a process listens on inside its own container; here each replica gets one of its own.
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
STOP_TIMEOUT_S = 30
HEALTHY_TIMEOUT_S = 240


class DeploymentError(RuntimeError):
    """A step of bringing the deployment up failed; the message says which and shows its log."""


def free_port(preferred: int | None = None) -> int:
    """`preferred` when nothing listens there on loopback, else one the kernel picks."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", preferred or 0))
        except OSError:
            s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def postgres_bin() -> Path | None:
    """The newest Debian PostgreSQL's programs, else an `initdb` on PATH."""
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: -int(Path(p).parent.name)):
        if Path(candidate, "initdb").exists():
            return Path(candidate)
    found = shutil.which("initdb")
    return Path(found).resolve().parent if found else None


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Processes:
    """Processes started here, each the leader of a session of its own, recorded under <root>/pids as
    pid + kernel start time: a later command finds them again, and stops them (and what they started
    in their session) by that pid, never by name. A reused pid has another start time."""

    def __init__(self, root: Path):
        self.pids, self.logs = root / "pids", root / "logs"

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def pid(self, name: str) -> int | None:
        record = self.pids / f"{name}.json"
        if not record.exists():
            return None
        saved = json.loads(record.read_text())
        return saved["pid"] if start_time(saved["pid"]) == saved["start_time"] and alive(saved["pid"]) else None

    def spawn(self, name: str, argv: list[str], env: dict[str, str]) -> int:
        self.pids.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.log(name), "ab") as log:
            proc = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        (self.pids / f"{name}.json").write_text(json.dumps({"pid": proc.pid, "start_time": start_time(proc.pid)}))
        return proc.pid

    def stop(self, names: list[str]) -> dict[str, str]:
        """SIGTERM each one's session, then SIGKILL what is still alive after STOP_TIMEOUT_S."""
        running = {name: pid for name in names if (pid := self.pid(name)) is not None}
        for pid in running.values():
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        said = {name: "not running" for name in names}
        for name, pid in running.items():
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            said[name] = f"stopped (pid {pid})"
            if alive(pid):
                os.killpg(pid, signal.SIGKILL)
                said[name] = f"killed (pid {pid})"
        for name in names:
            (self.pids / f"{name}.json").unlink(missing_ok=True)
        return said

    def kill(self, name: str) -> None:
        """SIGKILL one and every process it started (a container lost with its host)."""
        import psutil

        pid = self.pid(name)
        if pid is None:
            raise DeploymentError(f"{name} is not running")
        family = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        for member in family:
            member.kill()
        psutil.wait_procs(family, timeout=30)


class Postgres:
    """A private cluster as compose's `postgres` service is configured (POSTGRES_USER, _PASSWORD, _DB):
    password (scram) authentication on 127.0.0.1, the local socket in its own directory. Made once;
    later starts find its data."""

    def __init__(self, bindir: Path, service: Service, root: Path, port: int):
        env = service.environment
        self.user, self.password, self.database = env["POSTGRES_USER"], env["POSTGRES_PASSWORD"], env["POSTGRES_DB"]
        self.root, self.bindir, self.port = root, bindir, port
        self.data = root / "data"
        # The server runs as `postgres` when we are root: it must own its directory and reach it.
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([*self.as_user, *argv], timeout=120, capture_output=True, text=True, check=False)
        if check and proc.returncode != 0:
            raise DeploymentError(f"{Path(argv[0]).name} failed: {proc.stdout}{proc.stderr}\n{tail(self.root / 'log')}")
        return proc

    def running(self) -> bool:
        return (
            self.data.exists()
            and self.run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "status", check=False).returncode == 0
        )

    def initdb(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        pwfile = self.root / "pwfile"
        pwfile.touch(mode=0o600)
        pwfile.write_text(self.password + "\n")
        if self.as_user:
            for path in (self.root, pwfile):
                shutil.chown(path, "postgres", "postgres")
            parent = self.root.parent  # `postgres` passes through it (o+x), lists nothing in it
            parent.chmod(parent.stat().st_mode | 0o001)
        initdb = [str(self.bindir / "initdb"), "-D", str(self.data), "-U", self.user, "-E", "UTF8"]
        try:
            self.run(*initdb, "--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}")
        finally:
            pwfile.unlink()

    def start(self) -> str:
        if self.running():
            return "already up"
        if not (self.data / "PG_VERSION").exists():
            self.initdb()
        options = f"-p {self.port} -h 127.0.0.1 -k {self.root} -c max_connections=300"
        pg_ctl = [str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log")]
        self.run(*pg_ctl, "-o", options, "-w", "start")
        client = ["-h", str(self.root), "-p", str(self.port), "-U", self.user]
        query = f"SELECT 1 FROM pg_database WHERE datname = '{self.database}'"
        if not self.run(str(self.bindir / "psql"), *client, "-d", "postgres", "-tAc", query).stdout.strip():
            self.run(str(self.bindir / "createdb"), *client, self.database)
        return "started"

    def stop(self) -> str:
        if not self.running():
            return "not running"
        self.run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop", check=False)
        return "stopped"


#: The redis image's entrypoint, here: it runs the command it is given with the options that keep this
#: redis private (loopback, its own port, nothing persisted: compose's `redis` keeps no volume).
REDIS_ENTRYPOINT = """#!/bin/sh
exec "$@" --bind 127.0.0.1 --port "$PCFLOW_REDIS_PORT" --save '' --appendonly no --daemonize no
"""


def redis_process(service: Service, root: Path, port: int) -> tuple[list[str], dict[str, str]]:
    """compose's `redis` command and environment, run in `root` (the container's /data) with a
    `docker-entrypoint.sh` that keeps it on loopback: the password file is written as compose writes it."""
    executable = shutil.which("redis-server")
    if executable is None:
        raise DeploymentError("redis-server is not installed (make system-deps installs it: redis-server)")
    shims = root / "bin"
    write_if_changed(shims / "docker-entrypoint.sh", REDIS_ENTRYPOINT, mode=0o755)
    path = os.pathsep.join([str(shims), str(Path(executable).parent), "/usr/bin", "/bin"])
    env = {**service.environment, "PATH": path, "PCFLOW_REDIS_PORT": str(port)}
    if service.argv[:2] != ["sh", "-c"] or len(service.argv) != 3:
        raise DeploymentError(f"compose's redis command is not `sh -c SCRIPT` any more: {service.argv}")
    return ["sh", "-c", f'cd "$0" && {service.argv[2]}', str(root)], env


def wait_for_port(port: int, processes: Processes, name: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        if processes.pid(name) is None:
            raise DeploymentError(f"{name} exited:\n{tail(processes.log(name))}")
        time.sleep(0.2)
    raise DeploymentError(f"{name} did not listen on {port} in {timeout:.0f} s:\n{tail(processes.log(name))}")


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

    def command(self, value: str) -> str:
        """A `_CMD` option's command (Airflow splits it with shlex): each word's container path and URL."""
        return shlex.join(self.url(self.path(word)) for word in shlex.split(value))

    def environment(self, base: dict[str, str]) -> dict[str, str]:
        env = {
            k: self.command(v) if k.endswith("_CMD") else self.url(self.path(v))
            for k, v in self.service.environment.items()
        }
        return {**base, **env, "AIRFLOW_HOME": str(self.home), "HOME": str(self.home), "HOSTNAME": self.name}

    def argv(self) -> list[str]:
        argv = [self.path(a) for a in self.service.argv]
        if argv[0] == "airflow":
            argv[0] = str(BIN / "airflow")
        return argv


def create_state(
    root: Path, *, workers: int, triggerers: int, api_port: int | None, process_env: dict[str, str] | None = None
) -> dict:
    """Ports, replica counts and the processes' base environment, chosen once (later commands find the
    same deployment at the same URL, running the same code)."""
    replicas = {
        "airflow-apiserver": 1,
        "airflow-scheduler": 1,
        "airflow-dag-processor": 1,
        "airflow-worker": workers,
        "airflow-triggerer": triggerers,
    }
    names = [f"{service}-{i}" for service, count in replicas.items() for i in range(1, count + 1)]
    ports = {"airflow-apiserver": free_port(api_port), "postgres": free_port(), "redis": free_port()}
    ports.update({name: free_port() for name in names if name.rsplit("-", 1)[0] in PRIVATE_PORTS})
    state = {"replicas": replicas, "ports": ports, "process_env": process_env}
    (root / "deployment.json").write_text(json.dumps(state, indent=2))
    return state


class Deployment:
    """The default services of docker-compose.yaml, from the `.env` and state under `root`: postgres,
    redis, airflow-init (run to its end), api-server, scheduler, dag-processor, Celery workers and
    triggerers. `workers`, `triggerers` and `api_port` (tried first) count only when the state is new."""

    def __init__(
        self,
        root: Path,
        *,
        workers: int = 1,
        triggerers: int = 1,
        api_port: int | None = None,
        process_env: dict[str, str] | None = None,
    ):
        self.root = root
        self.project = Project.resolve(root / ".env")
        saved = root / "deployment.json"
        state = (
            json.loads(saved.read_text())
            if saved.exists()
            else create_state(root, workers=workers, triggerers=triggerers, api_port=api_port, process_env=process_env)
        )
        self.replicas, self.ports = state["replicas"], state["ports"]
        self.process_env: dict[str, str] | None = state.get("process_env")
        self.url = f"http://127.0.0.1:{self.ports['airflow-apiserver']}"
        self.processes = Processes(root)
        self.token: str | None = None
        init = self.project.services["airflow-init"].environment
        self.username, self.password = init["_AIRFLOW_WWW_USER_USERNAME"], init["_AIRFLOW_WWW_USER_PASSWORD"]

    def names(self) -> dict[str, str]:
        """Each replica's name (its hostname) -> its compose service."""
        return {f"{s}-{i}": s for s, count in self.replicas.items() for i in range(1, count + 1)}

    def postgres(self) -> Postgres:
        bindir = postgres_bin()
        if bindir is None:
            raise DeploymentError("PostgreSQL is not installed (make system-deps installs it: postgresql)")
        return Postgres(bindir, self.project.services["postgres"], self.root / "postgres", self.ports["postgres"])

    # -- what every process gets besides its compose environment -------------------------------------
    def base_environment(self) -> dict[str, str]:
        """What every process gets before its compose environment: the one given when the deployment was
        made (the deployment tests give the image's layout: pcflow from its wheel), else this checkout's
        PATH (Airflow's scripts first), locale and HOME, and nothing of the caller's (no AIRFLOW_*, no
        AWS_*, no connections: those come from compose)."""
        if self.process_env:
            return dict(self.process_env)
        keep = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "LC_ALL", "TZ", "USER", "TMPDIR")}
        path = os.pathsep.join([str(BIN), "/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"])
        # This checkout's pcflow, as the image runs the wheel built from it: the environment's editable
        # install may be another checkout's (a git worktree sharing the virtual environment).
        return {**keep, "PATH": path, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO / "plugins")}

    def endpoints(self) -> dict[tuple[str, int], int]:
        return {
            ("postgres", 5432): self.ports["postgres"],
            ("redis", 6379): self.ports["redis"],
            ("airflow-apiserver", 8080): self.ports["airflow-apiserver"],
        }

    def container(self, service: str, name: str) -> Container:
        return Container(self.project.services[service], name, self.root, self.endpoints())

    def environment(self, container: Container, service: str) -> dict[str, str]:
        env = container.environment(self.base_environment())
        if service in PRIVATE_PORTS:
            env[PRIVATE_PORTS[service]] = str(self.ports.get(container.name) or free_port())
        return env

    # -- lifecycle ----------------------------------------------------------------------------------------
    def start(self) -> dict[str, str]:
        """Up, whatever was up before: what runs is left running, what is missing starts (airflow-init
        first: migrations, the first user and the pools are idempotent). Returns what each one did."""
        said = {"postgres": self.postgres().start(), "redis": self.start_redis()}
        missing = [name for name in self.names() if self.processes.pid(name) is None]
        if missing:
            self.run_init()
        for name, service in self.names().items():
            pid = self.processes.pid(name)
            said[name] = f"already up (pid {pid})" if pid else f"started (pid {self.spawn(service, name)})"
        self.wait_healthy()
        self.token = self.login()
        return said

    def start_redis(self) -> str:
        pid = self.processes.pid("redis")
        if pid is not None:
            return f"already up (pid {pid})"
        argv, env = redis_process(self.project.services["redis"], self.root / "redis", self.ports["redis"])
        pid = self.processes.spawn("redis", argv, env)
        wait_for_port(self.ports["redis"], self.processes, "redis")
        return f"started (pid {pid})"

    def run_init(self) -> None:
        init = self.run_once("airflow-init")
        self.processes.log("airflow-init").write_text(init.stdout + init.stderr)
        if init.returncode != 0:
            raise DeploymentError(f"airflow-init failed:\n{init.stdout[-3000:]}\n{init.stderr[-5000:]}")

    def run_once(self, service: str, **overrides: str) -> subprocess.CompletedProcess:
        container = self.container(service, f"{service}-1")
        env = {**self.environment(container, service), **overrides}
        return subprocess.run(
            container.argv(),
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )

    def spawn(self, service: str, name: str) -> int:
        """One replica, in its own UTS namespace named after it (its hostname, as a container's)."""
        container = self.container(service, name)
        argv = container.argv()
        if service == "airflow-apiserver":  # the host side of compose's ports mapping, on loopback only
            argv += ["--host", "127.0.0.1", "--port", str(self.ports["airflow-apiserver"])]
        wrapped = ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', name, *argv]
        return self.processes.spawn(name, wrapped, self.environment(container, service))

    def kill(self, name: str) -> None:
        self.processes.kill(name)

    def stop(self) -> dict[str, str]:
        """Stop what start() started, and nothing else; the database's data stays for the next start."""
        said = self.processes.stop(list(self.names()))
        said.update(self.processes.stop(["redis"]))
        said["postgres"] = self.postgres().stop()
        return said

    def status(self) -> dict[str, int | None]:
        """Each process's pid, None where it is not running."""
        return {name: self.processes.pid(name) for name in ("redis", *self.names())}

    # -- health and the REST API --------------------------------------------------------------------------
    def log_tail(self, name: str, lines: int = 40) -> str:
        return tail(self.processes.log(name), lines)

    def wait_healthy(self, timeout: float = HEALTHY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name in self.names():
                if self.processes.pid(name) is None:
                    raise DeploymentError(f"{name} exited:\n{self.log_tail(name)}")
            try:
                health = json.loads(self.request("GET", "/api/v2/monitor/health", auth=False))
                states = {k: (v or {}).get("status") for k, v in health.items()}
                if all(states.get(k) == "healthy" for k in ("metadatabase", "scheduler", "triggerer", "dag_processor")):
                    return
            except (OSError, urllib.error.URLError, ValueError):
                pass
            time.sleep(2)
        raise DeploymentError(f"services not healthy in {timeout}s:\n{self.log_tail('airflow-apiserver-1')}")

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
