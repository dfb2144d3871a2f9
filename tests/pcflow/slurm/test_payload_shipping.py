"""A payload shipped to the static cluster over the real sshd and run by the real Slurm: extracted once
per content hash (reused after), read-only, and a changed payload is what the next job runs."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest
from taskcontext import make_context
from test_slurm_job_operator import FAST, run_to_completion

from pcflow.slurm.hook import SlurmHook
from pcflow.slurm.operators import SlurmJobOperator
from pcflow.slurm.payload import build_archive, ship

pytestmark = pytest.mark.stack
log = logging.getLogger(__name__)


@pytest.fixture
def payload(tmp_path, monkeypatch) -> Path:
    """A payload `hello` in a private payloads directory (the rest of include/ stays the real one)."""
    source = tmp_path / "payloads" / "hello"
    source.mkdir(parents=True)
    (source / "main.py").write_text("import sys\nprint('hello hello', sys.argv[1:], __file__)\n")
    monkeypatch.setattr("pcflow.slurm.payload.payloads_dir", lambda: tmp_path / "payloads")
    return source


@pytest.fixture
def shared_root(local_stack) -> str:
    return str(local_stack.shared_root / "tests" / f"ship-{uuid.uuid4().hex[:8]}")


def run_payload(shipped: dict, shared_root: str) -> str:
    op = SlurmJobOperator(
        task_id="hello",
        program=["main.py", "a b"],
        python="python3",
        payload_dir=shipped["dir"],
        shared_root=shared_root,
        **FAST,
    )
    result = run_to_completion(op, make_context("hello"))
    return Path(result["log"]).read_text()


def test_ship_once_per_hash_run_from_there_and_a_change_is_picked_up(payload, shared_root, local_stack):
    hook = SlurmHook()
    try:
        first = ship(hook, build_archive("hello"), shared_root=shared_root, log=log)
        assert first["dir"] == f"{shared_root}/pcflow/payloads/{first['digest']}" and not first["reused"]
        assert ship(hook, build_archive("hello"), shared_root=shared_root, log=log)["reused"] is True
        shipped = Path(first["dir"])
        assert (shipped / "main.py").read_text() == (payload / "main.py").read_text()
        assert not (shipped / "main.py").stat().st_mode & 0o222  # read-only: no job edits another run's code
        assert [p.name for p in shipped.parent.iterdir()] == [first["digest"]]  # no temporary directory left
        log_text = run_payload(first, shared_root)
        assert f"hello {payload.name}" in log_text
        assert f"['a b'] {first['dir']}/main.py" in log_text

        (payload / "main.py").write_text("print('changed payload')\n")
        second = ship(hook, build_archive("hello"), shared_root=shared_root, log=log)
        assert second["digest"] != first["digest"] and not second["reused"]
        assert "changed payload" in run_payload(second, shared_root)
        assert (shipped / "main.py").is_file()  # the earlier run's code is still what it was
    finally:
        hook.run(["chmod", "-R", "u+w", shared_root], check=False)
        hook.run(["rm", "-rf", shared_root], check=False)
        hook.close()


def test_a_concurrent_ship_of_the_same_hash_is_adopted_and_leaves_no_temporary_directory(
    payload, shared_root, monkeypatch
):
    """Two runs shipping the same payload at once: the second rename finds the first's directory."""
    hook = SlurmHook()
    archive = build_archive("hello")
    try:
        first = ship(hook, archive, shared_root=shared_root, log=log)
        looked_up, real_is_dir = [], hook.is_dir

        def not_there_yet(path: str) -> bool:  # the other run's rename lands after this one's look-up
            looked_up.append(path)
            return real_is_dir(path) if len(looked_up) > 1 else False

        monkeypatch.setattr(hook, "is_dir", not_there_yet)
        again = ship(hook, archive, shared_root=shared_root, log=log)
        assert looked_up == [first["dir"], first["dir"]]  # looked up, extracted, rename refused, found
        assert again["dir"] == first["dir"]
        assert [p.name for p in Path(first["dir"]).parent.iterdir()] == [archive.digest]
    finally:
        hook.run(["chmod", "-R", "u+w", shared_root], check=False)
        hook.run(["rm", "-rf", shared_root], check=False)
        hook.close()
