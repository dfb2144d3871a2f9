"""A run's own Python environment, built once per cluster from its requirements and reused by every later
run and node (`training.requirements`, built as the profile's `training.environment` says).

The environment's id is a hash of what decides its contents: the requirements' bytes (read from the staged
code on the cluster, at most MAX_REQUIREMENTS_BYTES), the base interpreter's version, the base (`layered`:
the base environment's integrity record, so a new image's environment is a new base; `isolated`: the
interpreter's path), and where packages come from (the admin's index options). The same inputs on the same
cluster find `<shared root>/pcflow/envs/<id>/` there and build nothing.

The build is `build-env.sh` (package data, sent over SSH with every prepare), run as the SSH user: under a
lock on the shared file system (one per cluster: builds on a cluster run one at a time, a reuse waits for
a build in progress, LOCK_WAIT_S at most, then the task retries), into a private temporary directory,
recorded with the same integrity record `check_environment` verifies (include/ami/tree-record.sh), renamed
into place in one step. Jobs run as their own account: they read and run the environment, never write it
(0755/0644, the SSH user's).

Eviction, least recently used first, while all environments together are above `quota_gib`: each prepare
writes its environment's last-used stamp (the time to the nanosecond) under the lock, and no environment
used within `in_use_hours` is evicted (a run that prepared it may still run: the admin sets it above the
longest run), nor the one being prepared.

A requirements file that does not install refuses the run (not retried: the same file fails again), naming
the end of uv's output; nothing half-built is left or reused. A lost connection, a busy lock or a full
disk is retried.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
import time
import uuid
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from pcflow.errors import ConfigurationError, PcflowError, connection_admin, profile_setting, refused, trigger_user
from pcflow.paths import remote_within
from pcflow.patterns import ABS_PATH
from pcflow.slurm.environment import environment_dir
from pcflow.slurm.trees import tree_record_script

if TYPE_CHECKING:
    from pcflow.runspec import EnvironmentSettings
    from pcflow.slurm.hook import SlurmHook

ENVS_DIR = "envs"
#: The lock, last-used stamps, sizes and uv's cache: the SSH user's only (0700), so no job can hold the lock.
STATE_DIR = "env-state"
MAX_REQUIREMENTS_BYTES = 1 << 20
ID_LEN = 20
#: How long a prepare waits for another run's build (the lock) before it fails and is retried.
LOCK_WAIT_S = 1800
#: build-env.sh's exit statuses.
FAILED, BUSY, NO_BUILDER = 3, 4, 5
#: In the end of a failed build's output: the cluster's fault, not the requirements' (retried).
TRANSIENT = re.compile(r"No space left|Failed to fetch|error sending request|Connection reset|timed out")
#: Requirement-file options that would change where packages come from (the admin's, in the profile).
OPTION = re.compile(r"^\s*(-\S+)")
ALLOWED_OPTIONS = ("--hash",)
OUTPUT_TAIL = 3000


class EnvironmentBuildFailed(ConfigurationError):
    """The run's requirements did not install: the same file fails again, so the run stops here."""


class EnvironmentBuildBusy(PcflowError):
    """Another build held the cluster's environment lock too long, or the cluster failed: retried."""


@cache
def build_script() -> str:
    """The build script as the wheel ships it (package data): sent with every prepare."""
    return resources.files("pcflow.slurm").joinpath("build-env.sh").read_text()


def requirements_path(code_dir: str, requirements: str) -> str:
    """`<code dir>/<requirements>`, refused unless it stays inside the code (staged code holds no links)."""
    try:
        return remote_within(posixpath.join(code_dir, requirements), code_dir)
    except ValueError as exc:
        raise refused("training.requirements", str(exc), trigger_user()) from None


def read_requirements(hook: SlurmHook, code_dir: str, requirements: str) -> bytes:
    """The requirements' bytes from the staged code, at most MAX_REQUIREMENTS_BYTES; refused when absent,
    larger, or naming options that would change where packages come from (the profile's to say)."""
    path = requirements_path(code_dir, requirements)
    size = hook.file_size(path)
    if size is None:
        raise refused("training.requirements", f"{requirements} is not in the run's code ({code_dir})", trigger_user())
    if size > MAX_REQUIREMENTS_BYTES:
        problem = f"{requirements} is {size} bytes, above {MAX_REQUIREMENTS_BYTES}: list packages, not data"
        raise refused("training.requirements", problem, trigger_user())
    data = hook.read_file(path, 0, MAX_REQUIREMENTS_BYTES)
    refuse_options(data, requirements)
    return data


def refuse_options(data: bytes, requirements: str) -> None:
    """Refuse a requirements file's options (`--index-url`, `-r other.txt`, ...) but a lock's `--hash`:
    where packages come from is the admin's (training.environment), not the code's."""
    for number, line in enumerate(data.decode(errors="replace").splitlines(), 1):
        option = OPTION.match(line)
        if option and not option.group(1).startswith(ALLOWED_OPTIONS):
            problem = (
                f"{requirements} line {number} sets {option.group(1)}: where packages come from is the "
                "profile's (training.environment), and a requirements file may not name other files"
            )
            raise refused("training.requirements", problem, trigger_user())


def probe_base(hook: SlurmHook, python: str, base: str) -> dict[str, str]:
    """What of the base goes into the id: the interpreter's version, and (layered) the base environment's
    record, which a job could not change (check_environment verifies it)."""
    if not ABS_PATH.fullmatch(python):
        raise refused("training.python", f"{python!r} is not an absolute path on the cluster", profile_setting())
    record = posixpath.join(environment_dir(python), ".pcflow-record", "marker") if base == "layered" else ""
    script = (
        "\"$1\" -c 'import platform, sys; print(platform.python_implementation(), sys.version.split()[0])' && "
        '{ [ -z "$2" ] || sha256sum < "$2" | cut -c1-64; }'
    )
    result = hook.run(["sh", "-c", script, "sh", python, record], check=False)
    lines = result.stdout.split()
    if result.exit_code != 0 or len(lines) != (3 if record else 2):
        problem = f"its base could not be read on the cluster: {(result.stderr or result.stdout).strip()[-500:]}"
        if record:
            problem += " (a layered environment needs a base environment with an integrity record)"
        raise refused("training.python", problem, profile_setting())
    return {"python": " ".join(lines[:2]), "base_record": lines[2] if record else python}


def environment_id(requirements: bytes, base: dict[str, str], environment: EnvironmentSettings) -> str:
    """The hash of everything that decides the environment's contents (requirements, Python, base, index)."""
    document = {
        "requirements": hashlib.sha256(requirements).hexdigest(),
        **base,
        "base": environment.base,
        "index": environment.index_options(),
    }
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()[:ID_LEN]


def prepare(
    hook: SlurmHook, *, code_dir: str, requirements: str, python: str, settings: dict[str, Any], shared_root: str, log
) -> dict[str, Any]:
    """The run's environment on the cluster, built unless it is there: {"id","dir","python","built","build_s"}."""
    from pcflow.runspec import EnvironmentSettings

    environment = EnvironmentSettings.model_validate(settings)
    if not ABS_PATH.fullmatch(shared_root or ""):
        problem = f"the cluster's shared root {shared_root!r} is not an absolute path (its environments live there)"
        raise refused("shared_root", problem, connection_admin(hook.ssh_conn_id))
    data = read_requirements(hook, code_dir, requirements)
    base = probe_base(hook, python, environment.base)
    env_id = environment_id(data, base, environment)
    root = posixpath.join(shared_root, "pcflow")
    envs, state = posixpath.join(root, ENVS_DIR), posixpath.join(root, STATE_DIR)
    # The bytes hashed are the bytes built: a private copy the script reads (an argument could not hold them).
    request = posixpath.join(state, "requests", f"{env_id}-{uuid.uuid4().hex[:8]}.txt")
    hook.make_private_dirs(state, posixpath.dirname(request))
    hook.write_file(request, data)
    argv = [
        *("bash", "-c", build_script(), "build-env.sh", tree_record_script(), envs, state, env_id, python),
        *(environment.base, str(environment.builder), str(int(environment.quota_gib * (1 << 30)))),
        *(str(int(environment.in_use_hours * 3600)), str(LOCK_WAIT_S), str(int(environment.build_timeout_s))),
        *(request, *environment.index_options()),
    ]
    begun = time.monotonic()
    try:
        result = hook.run(argv, check=False, timeout=LOCK_WAIT_S + environment.build_timeout_s)
    finally:
        hook.run(["rm", "-f", "--", request], check=False)
    outcome = parse_outcome(result.stdout, env_id)
    check_outcome(result, outcome, environment.builder, requirements)
    seconds = round(time.monotonic() - begun, 2)
    final = posixpath.join(envs, env_id)
    log_outcome(log, outcome, final, requirements, seconds)
    return {
        "id": env_id,
        "dir": final,
        "python": posixpath.join(final, "bin", "python"),
        "built": outcome["built"],
        "build_s": seconds if outcome["built"] else 0.0,
        "base": environment.base,
        "base_python": python,
    }


def parse_outcome(stdout: str, env_id: str) -> dict[str, Any]:
    """build-env.sh's lines as data: built or reused, its size, what was evicted, and a failure's output."""
    outcome: dict[str, Any] = {"built": False, "done": False, "size": None, "evicted": [], "over_quota": None}
    lines = stdout.splitlines()
    for number, line in enumerate(lines):
        kind, *rest = line.split()
        if kind in ("built", "reused") and rest[:1] == [env_id]:
            outcome["built"], outcome["done"] = kind == "built", True
        elif kind == "size" and rest and rest[0].isdigit():
            outcome["size"] = int(rest[0])
        elif kind == "evicted" and len(rest) == 2:
            outcome["evicted"].append({"id": rest[0], "bytes": int(rest[1]) if rest[1].isdigit() else None})
        elif kind == "over-quota" and len(rest) == 2:
            outcome["over_quota"] = rest
        elif kind == "failed":
            outcome["output"] = "\n".join(lines[number + 1 :])[-OUTPUT_TAIL:]
            break
    return outcome


def check_outcome(result: Any, outcome: dict[str, Any], builder: str | None, requirements: str) -> None:
    """Raise for a build that did not end in an environment: the requirements' fault refuses the run (not
    retried), a missing builder is the admin's, anything else is the cluster's (retried)."""
    if result.exit_code == 0 and outcome["done"]:
        return
    tail = outcome.get("output") or (result.stderr or result.stdout).strip()[-OUTPUT_TAIL:]
    if result.exit_code == NO_BUILDER:
        problem = f"no uv at {builder} on the cluster (the image's bake or the admin installs it there)"
        raise refused("training.environment.builder", problem, profile_setting())
    if result.exit_code == FAILED and not TRANSIENT.search(tail):
        raise EnvironmentBuildFailed(
            f"training.requirements: {requirements} did not install, so no environment was made (nothing "
            f"half-built is kept); the end of uv's output:\n{tail}"
        )
    if result.exit_code == BUSY:
        raise EnvironmentBuildBusy(f"another run's environment build held the lock for {LOCK_WAIT_S} s; retried")
    raise EnvironmentBuildBusy(f"the environment build failed on the cluster (exit {result.exit_code}): {tail}")


def log_outcome(log, outcome: dict[str, Any], final: str, requirements: str, seconds: float) -> None:
    """One line for the build or reuse, one for each eviction, a warning above the quota."""
    how = "built" if outcome["built"] else "reused (nothing built)"
    log.info("environment %s from %s %s in %.2f s (%s bytes)", final, requirements, how, seconds, outcome["size"])
    for evicted in outcome["evicted"]:
        log.info("evicted environment %s (%s bytes, least recently used, above the quota)", *evicted.values())
    if outcome["over_quota"]:
        log.warning(
            "environments take %s bytes, above the quota of %s: every other one was used within "
            "training.environment.in_use_hours, so none was evicted",
            *outcome["over_quota"],
        )
