"""The job's environment checked over the real sshd before a job runs in it: against the record written
when it was built (include/ami/tree-record.sh), in full the first time and whenever anything in it changed
status, cheaply otherwise; a missing or mismatching record refuses the run and says how to rebuild."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from pcflow.paths import include_dir
from pcflow.slurm.environment import EnvironmentRefused, state_path, verify_environment

pytestmark = [pytest.mark.stack, pytest.mark.security]
log = logging.getLogger(__name__)
RECORD = include_dir() / "ami" / "tree-record.sh"
REPO = include_dir().parent


def write_record(env: Path) -> str:
    out = subprocess.run(["bash", str(RECORD), "write", str(env)], capture_output=True, text=True, check=True)
    return out.stdout


@pytest.fixture
def shared_root(local_stack) -> Path:
    root = local_stack.shared_root / "tests" / f"env-{uuid.uuid4().hex[:8]}"
    root.mkdir(parents=True)
    yield root
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)
    shutil.rmtree(root)


@pytest.fixture
def env(shared_root) -> Path:
    """A small environment as an installer leaves it: an interpreter link, modules, lib64 -> lib, a record."""
    env = shared_root / "venv"
    site = env / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (env / "bin").mkdir()
    (env / "bin" / "python").symlink_to(sys.executable)
    (env / "lib64").symlink_to("lib")
    (site / "mod.py").write_text("VALUE = 1\n")
    (site / "other.py").write_text("print('other')\n")
    assert "recorded 2 files" in write_record(env)
    later()
    return env


def verify(env: Path, shared_root: Path, slurm) -> dict:
    return verify_environment(slurm, f"{env}/bin/python", shared_root=str(shared_root), log=log)


def refusal(env: Path, shared_root: Path, slurm) -> str:
    with pytest.raises(EnvironmentRefused) as refused:
        verify(env, shared_root, slurm)
    message = str(refused.value)
    assert f"the environment {env} is not verified, so no job runs in it" in message
    assert "Rebuild it where it is built" in message and "make payload-env" in message
    return message


def later() -> None:
    """The check dates its state 0.1 s before it began (file times lag the clock by up to a tick): what
    changes in the tree must change later than that to count as after it (and what was made, before)."""
    time.sleep(0.2)


def test_verified_in_full_once_then_cheaply_and_again_in_full_after_any_change(env, shared_root, slurm):
    first = verify(env, shared_root, slurm)
    assert first["dir"] == str(env) and first["full_check"] is True and len(first["record"]) == 64
    state = Path(state_path(str(shared_root), str(env)))
    assert state.read_text() == first["record"]
    assert stat.S_IMODE(state.stat().st_mode) == 0o600 and stat.S_IMODE(state.parent.stat().st_mode) == 0o700
    second = verify(env, shared_root, slurm)
    assert (second["full_check"], second["record"]) == (False, first["record"])
    os.utime(env / "lib/python3.11/site-packages/mod.py")  # same bytes, but its status changed: hashed again
    later()
    assert verify(env, shared_root, slurm)["full_check"] is True
    assert verify(env, shared_root, slurm)["full_check"] is False


def test_a_file_changed_after_its_full_check_is_found_and_refused(env, shared_root, slurm):
    verify(env, shared_root, slurm)
    later()
    (env / "lib/python3.11/site-packages/mod.py").write_text("VALUE = 2\n")
    message = refusal(env, shared_root, slurm)
    assert "lib/python3.11/site-packages/mod.py does not have its recorded sha256" in message


@pytest.mark.parametrize(
    ("tamper", "said"),
    [
        (lambda e: (e / "lib/python3.11/site-packages/evil.pth").write_text("import os\n"), "evil.pth was not there"),
        (lambda e: (e / "lib/python3.11/site-packages/other.py").unlink(), "other.py is missing"),
        (lambda e: ((e / "lib64").unlink(), (e / "lib64").symlink_to("/tmp")), "lib64 -> /tmp is a link that was not"),
        (lambda e: (e / "lib/python3.11/site-packages/mod.py").chmod(0o666), "mod.py is writable by group or others"),
        (lambda e: (e / "lib/python3.11").chmod(0o777), "lib/python3.11 is writable by group or others"),
        (
            lambda e: os.chown(e / "lib/python3.11/site-packages/mod.py", 65534, 65534),
            "mod.py is owned by a user other",
        ),
        (lambda e: os.mkfifo(e / "lib/fifo"), "lib/fifo is not a regular file or directory"),
    ],
    ids=["planted-pth", "removed", "link-retargeted", "writable-file", "writable-dir", "other-owner", "fifo"],
)
def test_what_another_user_or_a_job_could_do_is_refused(env, shared_root, slurm, tamper, said):
    verify(env, shared_root, slurm)
    later()
    tamper(env)
    assert said in refusal(env, shared_root, slurm)


def test_a_missing_or_changed_record_or_environment_is_refused(env, shared_root, slurm):
    files = env / ".pcflow-record" / "files.sha256"
    files.chmod(0o644)
    files.write_text(files.read_text().replace("mod.py", "mud.py"))
    assert ".pcflow-record does not match its own marker" in refusal(env, shared_root, slurm)
    shutil.rmtree(env / ".pcflow-record")
    assert "it has no integrity record (.pcflow-record/)" in refusal(env, shared_root, slurm)
    shutil.rmtree(env)
    assert "it does not exist on the cluster" in refusal(env, shared_root, slurm)


def test_an_interpreter_outside_an_environment_is_refused(shared_root, slurm):
    for python in ("python3", "/usr/bin/../python3", "/opt/venv/python"):
        with pytest.raises(EnvironmentRefused, match="is not an environment's interpreter"):
            verify_environment(slurm, python, shared_root=str(shared_root), log=log)


def test_a_recorder_refuses_a_tree_others_could_change(shared_root):
    tree = shared_root / "open"
    tree.mkdir()
    (tree / "x.py").write_text("x\n")
    tree.chmod(0o777)
    out = subprocess.run(["bash", str(RECORD), "write", str(tree)], capture_output=True, text=True, check=False)
    assert out.returncode == 1 and "other users could change" in out.stderr and "writable ." in out.stderr
    assert not (tree / ".pcflow-record").exists()


def test_the_payload_environment_of_this_machine_is_verified(shared_root, slurm, caplog):
    """.venv-payload, as `make payload-env` builds and records it (the local and rehearsal profiles' env)."""
    subprocess.run(
        ["bash", str(REPO / "include/payloads/install-payload-env.sh"), str(REPO / ".venv-payload")], check=True
    )
    python = f"{REPO}/include/../.venv-payload/bin/python"  # as the profiles spell it
    with caplog.at_level(logging.INFO):
        full = verify_environment(slurm, python, shared_root=str(shared_root), log=log)
        cheap = verify_environment(slurm, python, shared_root=str(shared_root), log=log)
    assert full["full_check"] is True and cheap["full_check"] is False and cheap["record"] == full["record"]
    print(f"\n.venv-payload: full check {full['check_s']:.2f} s, cheap check {cheap['check_s']:.2f} s")
