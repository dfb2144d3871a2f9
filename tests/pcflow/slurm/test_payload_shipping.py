"""A payload shipped to the static cluster over the real sshd and run by the real Slurm: extracted once
per content hash (reused after, once one check found every file as shipped), read-only, and a changed
payload is what the next job runs. A staged directory that was changed (a file edited, one added, made
writable) is moved aside and staged again."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest
from taskcontext import make_context
from test_slurm_job_operator import FAST, run_to_completion

from pcflow.slurm import payload as payload_module
from pcflow.slurm.hook import SlurmHook
from pcflow.slurm.operators import SlurmJobOperator
from pcflow.slurm.payload import build_archive, ship
from pcflow.slurm.trees import FINDINGS, TreeCheck

pytestmark = pytest.mark.stack
log = logging.getLogger(__name__)


@pytest.fixture
def payload(tmp_path, monkeypatch) -> Path:
    """A payload `hello` in a private payloads directory (the rest of include/ stays the real one)."""
    source = tmp_path / "payloads" / "hello"
    source.mkdir(parents=True)
    (source / "main.py").write_text("import sys\nprint('hello hello', sys.argv[1:], __file__)\n")
    monkeypatch.setattr("pcflow.paths.payloads_dir", lambda: tmp_path / "payloads")
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
        remove(hook, shared_root)


def test_a_concurrent_ship_of_the_same_hash_is_adopted_and_leaves_no_temporary_directory(
    payload, shared_root, monkeypatch
):
    """Two runs shipping the same payload at once: the second rename finds the first's directory, and
    adopts it only after checking it."""
    hook = SlurmHook()
    archive = build_archive("hello")
    try:
        first = ship(hook, archive, shared_root=shared_root, log=log)
        looked_up, real_compare = [], payload_module.compare_tree

        def not_there_yet(hook, directory, checksums):  # the other run's rename lands after this one's look-up
            looked_up.append(directory)
            if len(looked_up) == 1:
                return TreeCheck(directory, ("absent .",))
            return real_compare(hook, directory, checksums)

        monkeypatch.setattr(payload_module, "compare_tree", not_there_yet)
        again = ship(hook, archive, shared_root=shared_root, log=log)
        assert looked_up == [first["dir"], first["dir"]]  # looked up, extracted, rename refused, checked
        assert again["dir"] == first["dir"]
        assert [p.name for p in Path(first["dir"]).parent.iterdir()] == [archive.digest]
    finally:
        remove(hook, shared_root)


def remove(hook: SlurmHook, shared_root: str) -> None:
    hook.run(["chmod", "-R", "u+w", shared_root], check=False)
    hook.run(["rm", "-rf", shared_root], check=False)
    hook.close()


def edit(path: Path, text: str) -> None:
    """What a job running as the payload's owner could do: make a file writable, change it, make it read-only."""
    path.chmod(0o644)
    path.write_text(text)
    path.chmod(0o444)


@pytest.mark.security
@pytest.mark.parametrize(
    ("tamper", "finding"),
    [
        (lambda d: edit(d / "main.py", "print('not what was shipped')\n"), "changed main.py"),
        (
            lambda d: (d.chmod(0o755), (d / "sitecustomize.py").write_text("import os\n"), d.chmod(0o555)),
            "extra sitecustomize.py",
        ),
        (lambda d: (d / "main.py").chmod(0o664), "writable main.py"),
        (lambda d: ((d / "main.py").unlink(),), "missing main.py"),
    ],
    ids=["edited", "extra-file", "group-writable", "removed"],
)
def test_a_staged_payload_that_changed_is_moved_aside_and_staged_again(payload, shared_root, caplog, tamper, finding):
    hook = SlurmHook()
    archive = build_archive("hello")
    try:
        first = ship(hook, archive, shared_root=shared_root, log=log)
        staged = Path(first["dir"])
        tamper(staged)
        with caplog.at_level(logging.WARNING):
            again = ship(hook, archive, shared_root=shared_root, log=log)
        assert again == {**first, "reused": False}
        assert (staged / "main.py").read_text() == (payload / "main.py").read_text()  # staged again, as shipped
        assert sorted(p.name for p in staged.iterdir()) == ["main.py"]
        (aside,) = [p for p in staged.parent.iterdir() if p.is_dir() and p.name != archive.digest]
        assert aside.name.startswith(f"rejected-{archive.digest}-")  # kept for an admin, never deleted
        assert finding in Path(f"{aside}.why").read_text().splitlines()
        kind, path = finding.split()
        assert f"is not what pcflow shipped: {path} {FINDINGS[kind]}" in caplog.text
        assert f"Moving it aside to {aside}" in caplog.text
        assert ship(hook, archive, shared_root=shared_root, log=log)["reused"] is True
    finally:
        remove(hook, shared_root)


def test_an_unchanged_payload_is_reused_after_one_check(payload, shared_root, monkeypatch):
    """Reuse costs one command on the head node (the check), nothing else: no stat, no copy."""
    hook = SlurmHook()
    archive = build_archive("hello")
    try:
        ship(hook, archive, shared_root=shared_root, log=log)
        calls = []
        for name in ("run", "command_input", "is_dir", "makedirs", "write_file", "file_size", "read_file"):
            real = getattr(hook, name)
            monkeypatch.setattr(
                hook, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k)
            )
        assert ship(hook, archive, shared_root=shared_root, log=log)["reused"] is True
        assert calls == ["command_input"]  # run_with_input: the archive's checksums on the check's stdin
    finally:
        remove(hook, shared_root)
