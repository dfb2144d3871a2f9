"""Shared test plumbing: the local stack, started once when a test asks for it and stopped at the end
of the session when the session started it (a developer's running stack is left as it was)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from dagrun import airflow_environment, prepare_airflow, write_profile
from stacktools import REPO, LocalStack, moto_leftovers, read_env_file, reset_moto, stack_cli, stack_status

ARTIFACTS = REPO / "tests" / "artifacts"
PCLUSTER_INSTALL_SCRIPT = REPO / "include" / "cluster" / "install-pcluster.sh"
# PCFLOW_STACK_DIR gives a test run a private stack (its own ports, moto, Slurm and Airflow home).
STATE_DIR = Path(os.environ.get("PCFLOW_STACK_DIR", REPO / ".stack"))
# Airflow reads its settings once, when first imported: settle them before any test imports airflow.
os.environ.setdefault("AIRFLOW_HOME", str(STATE_DIR / "airflow"))
for _key, _value in airflow_environment(Path(os.environ["AIRFLOW_HOME"])).items():
    os.environ.setdefault(_key, _value)


_STACK_WAS_UP = False
_STACK: LocalStack | None = None  # set once a test has asked for the local stack


def pytest_sessionstart(session):
    global _STACK_WAS_UP  # noqa: PLW0603 - session-wide fact, read once at the end
    try:
        _STACK_WAS_UP = all(s["ready"] for s in stack_status().values())
    except Exception:  # no environment yet: nothing was up
        _STACK_WAS_UP = False


_STACK: LocalStack | None = None  # set once a test has asked for the local stack


def pytest_collection_modifyitems(items):
    """`stack` on every test that asks for the local stack (the fixture, directly or through another), so
    that `-m "not stack"` never starts it. A module that reaches the stack some other way marks itself."""
    for item in items:
        if "local_stack" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.stack)


def pytest_sessionfinish(session, exitstatus):
    if not _STACK_WAS_UP and (STATE_DIR / "ports.json").exists():
        stack_cli("down")


@pytest.fixture(scope="session")
def local_stack() -> LocalStack:
    """The embedded default, up; its connections (`AIRFLOW_CONN_*`, AWS endpoint) in os.environ."""
    proc = stack_cli("up")
    if proc.returncode != 0:
        pytest.fail(f"local stack did not come up:\n{proc.stdout}\n{proc.stderr}")
    state_dir = STATE_DIR
    env = read_env_file(state_dir / "env")
    os.environ.update(env)
    global _STACK  # noqa: PLW0603 - read by the per-module moto reset below
    _STACK = LocalStack(state_dir=state_dir, env=env, ports=json.loads((state_dir / "ports.json").read_text()))
    return _STACK


def _may_reset_moto() -> bool:
    """Wiping the moto server is safe only where nothing else uses it: the session started the stack
    itself (CI, `make test` from nothing), or PCFLOW_TEST_RESET_MOTO=1 says this stack is private. A
    developer's running stack is shared (other test runs, the demo), so by default it is left as is."""
    flag = os.environ.get("PCFLOW_TEST_RESET_MOTO", "")
    return flag == "1" or (flag != "0" and not _STACK_WAS_UP)


@pytest.fixture(scope="module", autouse=True)
def moto_state_per_module(request):
    """After each test module that used the local stack: check that the module left nothing behind on
    the moto server (an error on its last test, naming what leaked), then reset moto to empty and
    re-seed what the stack seeds. Each module then starts on a fresh account: moto resolves tag
    filters with scans of all the tags it holds, so leftovers slow every later call (runs measured
    moto at 100% CPU with a hundred leftover instances). No test depends on another module's state."""
    yield
    if _STACK is None or not _may_reset_moto():
        return
    module = request.node.nodeid
    items = [i for i in request.session.items if i.nodeid.startswith(f"{module}::")]
    if not any("local_stack" in getattr(i, "fixturenames", ()) for i in items):
        return
    leaked = moto_leftovers(_STACK)
    reset_moto(_STACK)
    if leaked:
        listing = "\n  ".join(leaked)
        pytest.fail(f"left on the moto server by this module (tests delete what they create):\n  {listing}")


#: The local stack's container image (include/local/build-image.sh), as a run names it (training.container).
LOCAL_IMAGE_LAYOUT = REPO / ".stack-images" / "debian-python3"
LOCAL_IMAGE = f"oci:{LOCAL_IMAGE_LAYOUT}:bookworm-python3"


@pytest.fixture(scope="session")
def local_image() -> str:
    """The local container image, built once (about a minute, from the Debian mirror) and kept in
    .stack-images/ for every later session and stack (its digest stays the same while it is kept)."""
    import shutil

    if shutil.which("debootstrap") is None and not Path("/usr/sbin/debootstrap").exists():
        pytest.fail("debootstrap is missing: `make system-deps` installs it (the local image's build)")
    build = REPO / "include" / "local" / "build-image.sh"
    subprocess.run([str(build), str(LOCAL_IMAGE_LAYOUT)], check=True, timeout=900)
    return LOCAL_IMAGE


@pytest.fixture(scope="module")
def airflow(local_stack, tmp_path_factory):
    """For tests that run DAGs (`dagrun.run_dag`): the session's Airflow home with its metadata database
    (Airflow reads its home only once per process), pcflow's DAG and plugin folders, and the payload's
    environment."""
    home = Path(os.environ["AIRFLOW_HOME"])
    saved = dict(os.environ)
    os.environ.update(airflow_environment(home))
    os.environ["PCFLOW_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    prepare_airflow(home)
    subprocess.run(
        ["bash", str(REPO / "include/payloads/install-payload-env.sh"), str(REPO / ".venv-payload")], check=True
    )
    yield home
    os.environ.clear()
    os.environ.update(saved)


class AdminProfiles:
    """A deployment admin's profiles directory (PCFLOW_PROFILES_DIR, read by the DAG parser and the
    workers): tests that need settings a trigger user may not change write a profile here."""

    def __init__(self, directory: Path):
        self.directory = directory

    def make(self, base: str = "local", changes: dict | None = None, *, name: str | None = None) -> str:
        """A profile: `base` (a shipped profile) with `changes` laid over it; returns its name."""
        import uuid

        return write_profile(self.directory, name or f"t{uuid.uuid4().hex[:10]}", base, changes or {})


@pytest.fixture
def admin_profiles(tmp_path, monkeypatch) -> AdminProfiles:
    directory = tmp_path / "profiles"
    directory.mkdir()
    monkeypatch.setenv("PCFLOW_PROFILES_DIR", str(directory))
    return AdminProfiles(directory)


@pytest.fixture
def artifacts_dir(request) -> Path:
    """Where a test keeps what a person may want to look at afterwards (screenshots, reports)."""
    path = ARTIFACTS / request.node.name
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def pcluster_cli() -> Path:
    """The real CLI; installed on first use (about 25 s on a warm pip cache; 0.1 s when already there)."""
    started = time.monotonic()
    proc = subprocess.run(
        ["bash", str(PCLUSTER_INSTALL_SCRIPT)], capture_output=True, text=True, timeout=900, check=False
    )
    if proc.returncode != 0:
        pytest.fail(f"install-pcluster.sh failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    print(f"pcluster ready in {time.monotonic() - started:.1f} s: {proc.stdout.strip()}")
    return REPO / ".venv-pcluster" / "bin" / "pcluster"


@pytest.fixture(scope="session")
def standin_cli(local_stack, pcluster_cli) -> Path:
    """The local stack's ParallelCluster stand-in (include/local/pcluster-standin: its cluster is the local
    Slurm; dry runs go to the real CLI), as the stack's environment selects it (PCFLOW_PCLUSTER)."""
    return REPO / "include" / "local" / "pcluster-standin"
