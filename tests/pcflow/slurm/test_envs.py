"""A run's own environment built on the cluster from its requirements (pcflow.slurm.envs, build-env.sh) over
the real sshd, with the repository's pinned uv and no index: the packages are tiny wheels this module
writes in a find-links directory (`pcflow_tiny` 1.0 and 2.0; `pcflow_other` 1.0, which needs
`pcflow_torch`; `pcflow_torch` 1.0, which needs `pcflow_cuda`, which is nowhere). The base is a small
environment with an integrity record holding `pcflow_tiny` 1.0 and `pcflow_torch` 1.0+cpu (no
dependencies), as the local payload environment holds a CPU build of torch: a layered environment must
take the base's torch as it is, never resolve the index's and its CUDA packages."""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import subprocess
import time
import uuid
import zipfile
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowFailException
from taskcontext import make_context, run_to_end

from pcflow.errors import PcflowInputError
from pcflow.paths import include_dir
from pcflow.patterns import DEFAULT_JOB_USER
from pcflow.runspec import EnvironmentSettings
from pcflow.slurm.environment import verify_environment
from pcflow.slurm.envs import (
    EnvironmentBuildBusy,
    EnvironmentBuildFailed,
    environment_id,
    parse_outcome,
    prepare,
    refuse_options,
)
from pcflow.slurm.head_node import HeadNode
from pcflow.slurm.hook import SlurmHook
from pcflow.slurm.operators import SlurmJobOperator

log = logging.getLogger(__name__)
REPO = include_dir().parent
UV = REPO / ".venv" / "bin" / "uv"
SYSTEM_PYTHON = "/usr/bin/python3.11"  # one every account can run (jobs run as their own)


def tiny_wheel(wheels: Path, name: str, version: str, *requires: str) -> None:
    """A pure-Python wheel of one module whose VERSION says which one was imported."""
    info = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n",
        f"{info}/METADATA": metadata + "".join(f"Requires-Dist: {requirement}\n" for requirement in requires),
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: pcflow-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(wheels / f"{name}-{version}-py3-none-any.whl", "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)


@pytest.fixture(scope="module")
def place(local_stack):
    """A shared root of this module's own (its envs, state, code and wheels), the base environment in it."""
    root = local_stack.shared_root / "tests" / f"envs-{uuid.uuid4().hex[:8]}"
    wheels, code, base = root / "wheels", root / "code", root / "base"
    for directory in (wheels, code, root / "base-wheels"):
        directory.mkdir(parents=True)
    for name, version in (("pcflow_tiny", "1.0"), ("pcflow_tiny", "2.0")):
        tiny_wheel(wheels, name, version)
    tiny_wheel(wheels, "pcflow_other", "1.0", "pcflow_torch")
    tiny_wheel(wheels, "pcflow_torch", "1.0", "pcflow_cuda")
    tiny_wheel(root / "base-wheels", "pcflow_torch", "1.0+cpu")
    uv = [str(UV), "--no-config", "--cache-dir", str(root / "uv-cache")]
    subprocess.run([*uv, "venv", "-q", "--python", SYSTEM_PYTHON, str(base)], check=True)
    install = ["pip", "install", "-q", "--python", str(base / "bin/python"), "--no-index", "--find-links", str(wheels)]
    subprocess.run(
        [*uv, *install, "--find-links", str(root / "base-wheels"), "pcflow_tiny==1.0", "pcflow_torch"], check=True
    )
    subprocess.run(["chmod", "-R", "go-w", str(base)], check=True)  # uv leaves its .lock writable by all
    subprocess.run(["bash", str(include_dir() / "ami/tree-record.sh"), "write", str(base)], check=True)
    yield root
    subprocess.run(["chmod", "-R", "u+w", str(root)], check=False)
    shutil.rmtree(root)


def settings(place: Path, **changes) -> dict:
    """The admin's build settings as a profile would set them: the pinned uv, only the local wheels."""
    document = {"builder": str(UV), "find_links": [str(place / "wheels")], "no_index": True, **changes}
    return EnvironmentSettings.model_validate(document).model_dump()


def build(place: Path, requirements: str, text: str, **changes) -> dict:
    """`prepare_environment`'s work for the requirements `text` in the code directory."""
    (place / "code" / requirements).write_text(text)
    hook = SlurmHook()
    try:
        return prepare(
            hook,
            code_dir=str(place / "code"),
            requirements=requirements,
            python=str(place / "base/bin/python"),
            settings=settings(place, **changes),
            shared_root=str(place),
            log=log,
        )
    finally:
        hook.close()


def imported(python: str, *modules: str) -> dict[str, str]:
    probe = "import importlib, sys; print(*(importlib.import_module(m).VERSION for m in sys.argv[1:]))"
    out = subprocess.run([python, "-c", probe, *modules], capture_output=True, text=True, check=True).stdout
    return dict(zip(modules, out.split(), strict=True))


@pytest.mark.stack
def test_built_once_then_reused_layered_on_the_base_with_the_pins_winning(place):
    """A few seconds. The first prepare builds; the same requirements again build nothing and name the same
    environment; a pin of a version the base holds at another wins; one the base holds as pinned is not
    installed again (the base's is imported); and check_environment's verification passes on it."""
    first = build(place, "requirements.txt", "pcflow_tiny==2.0\npcflow_other\n")
    assert imported(first["python"], "pcflow_torch") == {"pcflow_torch": "1.0+cpu"}  # pcflow_other's, the base's
    assert first["built"] and first["build_s"] > 0 and first["dir"] == f"{place}/pcflow/envs/{first['id']}"
    assert imported(first["python"], "pcflow_tiny", "pcflow_other") == {"pcflow_tiny": "2.0", "pcflow_other": "1.0"}
    begun = time.monotonic()
    again = build(place, "requirements.txt", "pcflow_tiny==2.0\npcflow_other\n")
    assert (again["id"], again["built"], again["build_s"]) == (first["id"], False, 0.0)
    assert time.monotonic() - begun < first["build_s"] + 5

    layered = build(place, "requirements-base.txt", "pcflow_tiny==1.0\npcflow_torch==1.0\npcflow_other\n")
    assert layered["built"] and layered["id"] != first["id"]
    site = Path(layered["dir"]) / "lib/python3.11/site-packages"
    assert sorted(p.name for p in site.iterdir() if not p.name.startswith("_")) == [
        "pcflow_other",
        "pcflow_other-1.0.dist-info",
    ]  # the base's tiny and torch are not installed again, nor the index torch's missing CUDA package
    assert imported(layered["python"], "pcflow_tiny", "pcflow_torch") == {
        "pcflow_tiny": "1.0",
        "pcflow_torch": "1.0+cpu",
    }
    with pytest.raises(EnvironmentBuildFailed, match="pcflow-cuda"):  # isolated: the index's torch, needing CUDA
        build(place, "requirements-base.txt", "pcflow_tiny==1.0\npcflow_torch==1.0\npcflow_other\n", base="isolated")
    isolated = build(place, "requirements-base.txt", "pcflow_tiny==1.0\n", base="isolated")
    assert isolated["id"] not in (layered["id"], first["id"])
    assert (Path(isolated["dir"]) / "lib/python3.11/site-packages/pcflow_tiny").is_dir()

    hook = SlurmHook()
    try:
        checked = verify_environment(hook, first["python"], shared_root=str(place), log=log)
    finally:
        hook.close()
    assert checked["dir"] == first["dir"] and checked["full_check"]
    for env in (first, layered, isolated):
        assert oct(Path(env["dir"]).stat().st_mode & 0o777) == "0o755"


@pytest.mark.stack
@pytest.mark.security
def test_requirements_that_do_not_install_refuse_the_run_and_leave_nothing(place):
    with pytest.raises(EnvironmentBuildFailed) as failed:
        build(place, "requirements-bad.txt", "pcflow_other\npcflow_nothere==1.0\n")
    assert isinstance(failed.value, AirflowFailException)  # not retried: the same file fails again
    assert "did not install" in str(failed.value) and "pcflow-nothere" in str(failed.value)
    left = sorted(p.name for p in (place / "pcflow/envs").iterdir())
    assert not [name for name in left if name.startswith(".")], left  # no temporary directory
    assert not any((place / "pcflow/envs" / name / ".pcflow-env/requirements.txt").read_text().count("nothere")
                   for name in left)  # fmt: skip
    assert not list((place / "pcflow/env-state/requests").iterdir())
    with pytest.raises(EnvironmentBuildFailed, match="did not install"):  # a retry builds again: nothing reused
        build(place, "requirements-bad.txt", "pcflow_other\npcflow_nothere==1.0\n")
    # A build past training.environment.build_timeout_s (here: no time at all) is the cluster's, retried.
    with pytest.raises(EnvironmentBuildBusy, match="timed out") as late:
        build(place, "requirements-late.txt", "pcflow_other\n# late\n", build_timeout_s=0.5)
    assert not isinstance(late.value, AirflowFailException)
    assert not [p.name for p in (place / "pcflow/envs").iterdir() if p.name.startswith(".")]


@pytest.mark.stack
def test_least_recently_used_environments_are_evicted_above_the_quota_unless_in_use(place, caplog):
    """A quota of about 300 KiB (each environment takes about 80): with the in-use window at its default
    (72 h) nothing recently prepared is evicted, only a warning says the quota is passed; with a window of
    a millisecond the oldest go first, never the one being prepared."""
    caplog.set_level(logging.INFO)
    quota = 300 / (1 << 20)
    for number in range(4):
        build(place, f"r{number}.txt", f"pcflow_other\n# {number}\n", quota_gib=quota)
    envs = place / "pcflow/envs"
    assert len(list(envs.iterdir())) >= 4
    assert "above the quota" in caplog.text
    kept = build(place, "r3.txt", "pcflow_other\n# 3\n", quota_gib=quota, in_use_hours=1e-6)
    assert not kept["built"] and (envs / kept["id"]).is_dir()
    sizes = sum(int((place / "pcflow/env-state/size" / p.name).read_text()) for p in envs.iterdir())
    assert sizes <= quota * (1 << 30)
    assert "evicted environment" in caplog.text
    rebuilt = build(place, "r0.txt", "pcflow_other\n# 0\n", quota_gib=quota, in_use_hours=1e-6)
    assert rebuilt["built"]  # it was evicted: built again, from nothing half-there


@pytest.mark.stack
@pytest.mark.security
def test_a_job_account_runs_in_the_environment_and_cannot_write_it(place):
    """About 10 s: a real Slurm job as the job account imports from the built environment (its own
    package and the base's) and fails to change any of it."""
    env = build(place, "requirements.txt", "pcflow_tiny==2.0\npcflow_other\n")
    site = f"{env['dir']}/lib/python3.11/site-packages"
    script = (
        "import os, pcflow_tiny, pcflow_other; print('whoami:', os.getuid(), pcflow_tiny.VERSION)\n"
        "for path in (os.environ['SITE'] + '/pwned.py', os.environ['SITE'] + '/pcflow_tiny/__init__.py',\n"
        "             os.environ['ENV'] + '/bin/pwned', os.environ['ENV'] + '/.pcflow-record/marker'):\n"
        "    try:\n        open(path, 'a').close(); print('wrote:', path)\n"
        "    except OSError:\n        print('refused:', path)\n"
    )
    op = SlurmJobOperator(
        task_id="train",
        program=[env["python"], "-c", script],
        head_node=HeadNode(job_user=DEFAULT_JOB_USER),
        env={"SITE": site, "ENV": env["dir"]},
        poll_interval=0.2,
        confirm_interval=2.0,
    )
    result = run_to_end(op, make_context("train"))
    assert result["state"] == "COMPLETED", result
    lines = (Path(result["run_dir"]) / "job.log").read_text().splitlines()
    said = [line for line in lines if line.startswith(("whoami:", "wrote:", "refused:"))]
    uid, version = said[0].split()[1:]
    assert int(uid) == pwd.getpwnam(DEFAULT_JOB_USER).pw_uid != os.getuid() and version == "2.0"
    assert [line.split()[0] for line in said[1:]] == ["refused:"] * 4, lines
    assert not (Path(site) / "pwned.py").exists()


def test_a_requirements_file_may_not_choose_where_packages_come_from():
    refuse_options(b"torch==2.13.0 \\\n    --hash=sha256:00\nnumpy\n", "req.txt")  # a lock's hashes are fine
    for line in ("--index-url https://evil.example/simple", "-r other.txt", "--find-links /tmp", "-e ."):
        with pytest.raises(PcflowInputError, match=r"training\.requirements: req\.txt line 2 sets -"):
            refuse_options(f"numpy\n{line}\n".encode(), "req.txt")


def test_the_id_hashes_requirements_python_base_and_index():
    base = {"python": "CPython 3.11.2", "base_record": "ab" * 32}
    plain = EnvironmentSettings(builder="/opt/pcflow/bin/uv")
    same = environment_id(b"numpy==2.4.6\n", base, plain)
    assert same == environment_id(b"numpy==2.4.6\n", dict(base), EnvironmentSettings(builder="/elsewhere/uv"))
    others = {
        environment_id(b"numpy==2.4.5\n", base, plain),
        environment_id(b"numpy==2.4.6\n", {**base, "python": "CPython 3.12.1"}, plain),
        environment_id(b"numpy==2.4.6\n", {**base, "base_record": "cd" * 32}, plain),
        environment_id(b"numpy==2.4.6\n", base, EnvironmentSettings(builder="/u/uv", base="isolated")),
        environment_id(b"numpy==2.4.6\n", base, EnvironmentSettings(builder="/u/uv", index_url="https://i.example")),
    }
    assert same not in others and len(others) == 5


def test_the_build_output_is_read_as_data():
    out = "built e1 2.50\nsize 1024\nevicted e0 99\nover-quota 5000 4000\n"
    assert parse_outcome(out, "e1") == {
        "built": True,
        "done": True,
        "size": 1024,
        "evicted": [{"id": "e0", "bytes": 99}],
        "over_quota": ["5000", "4000"],
    }
    assert not parse_outcome("reused e2\n", "e1")["done"]  # another id's answer is not this one's
    failed = parse_outcome("failed\nerror: No solution\n  cause: x\n", "e1")
    assert not failed["done"] and failed["output"] == "error: No solution\n  cause: x"


def test_index_credentials_are_refused():
    with pytest.raises(ValueError, match="index_url"):
        EnvironmentSettings(builder="/u/uv", index_url="https://user:token@pypi.example/simple")
