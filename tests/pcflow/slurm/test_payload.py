"""Payload archives (deterministic, content-hashed, only plain files) and how a job runs a shipped payload."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest
from pydantic import ValidationError

from pcflow.paths import PayloadError, payload_source
from pcflow.runspec import AmiSettings, RunSpecError, resolve_run_spec
from pcflow.slurm.payload import build_archive, payload_root
from pcflow.slurm.render import render_batch_script
from pcflow.slurm.spec import JobSpec, RunDir


@pytest.fixture
def include(tmp_path, monkeypatch) -> Path:
    """A private include/ with one payload, `hello`."""
    root = tmp_path / "include"
    (root / "payloads" / "hello" / "lib").mkdir(parents=True)
    (root / "payloads" / "hello" / "main.py").write_text("print('hello')\n")
    (root / "payloads" / "hello" / "lib" / "util.py").write_text("X = 1\n")
    (root / "payloads" / "hello" / "run.sh").write_text("#!/bin/sh\n")
    (root / "payloads" / "hello" / "run.sh").chmod(0o755)
    monkeypatch.setenv("PCFLOW_INCLUDE_DIR", str(root))
    return root


def test_the_same_files_give_the_same_archive_and_a_change_gives_another(include):
    first, second = build_archive("hello"), build_archive("hello")
    assert first.data == second.data and first.digest == second.digest and first.files == 3
    os.utime(include / "payloads/hello/main.py", (1, 1))  # times and caches are not content
    (include / "payloads/hello/__pycache__").mkdir()
    (include / "payloads/hello/__pycache__/main.cpython-311.pyc").write_bytes(b"\0")
    assert build_archive("hello").digest == first.digest
    (include / "payloads/hello/main.py").write_text("print('changed')\n")
    assert build_archive("hello").digest != first.digest


def test_the_archive_holds_plain_members_inside_the_payload_with_normalised_owners_and_modes(include):
    with tarfile.open(fileobj=io.BytesIO(build_archive("hello").data)) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert sorted(members) == ["lib", "lib/util.py", "main.py", "run.sh"]
    assert all(not m.name.startswith(("/", "..")) and (m.isfile() or m.isdir()) for m in members.values())
    assert {(m.uid, m.gid, m.mtime) for m in members.values()} == {(0, 0, 0)}
    assert (members["run.sh"].mode, members["main.py"].mode, members["lib"].mode) == (0o755, 0o644, 0o755)


@pytest.mark.parametrize("name", ["../etc", "Hello", "hello/..", "", "missing"])
def test_only_a_payload_directory_by_its_plain_name_is_shipped(include, name):
    with pytest.raises(PayloadError, match="payload"):
        build_archive(name)


def test_a_payload_directory_linked_from_elsewhere_is_refused(include, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (include / "payloads" / "linked").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(PayloadError, match="is outside"):
        build_archive("linked")


def test_a_payload_is_found_in_examples_too_but_a_name_of_both_roots_is_refused(include, tmp_path, monkeypatch):
    """examples/ (PCFLOW_EXAMPLES_DIR, else beside include/) is the second payload root: the shipped
    profiles' `simclr` is there. A name both roots hold is refused rather than one of them guessed."""
    (tmp_path / "examples" / "project").mkdir(parents=True)
    (tmp_path / "examples" / "project" / "train.py").write_text("print('project')\n")
    assert build_archive("project").files == 1 and payload_source("project") == tmp_path / "examples" / "project"
    (tmp_path / "examples" / "hello").mkdir()
    with pytest.raises(PayloadError, match="'hello' is a directory of both"):
        build_archive("hello")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "examples" / "linked").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(PayloadError, match="is outside"):
        build_archive("linked")
    monkeypatch.setenv("PCFLOW_EXAMPLES_DIR", str(tmp_path / "mounted"))
    with pytest.raises(
        PayloadError, match=f"no directory 'project' in {include / 'payloads'} and {tmp_path / 'mounted'}"
    ):
        build_archive("project")


def test_the_images_environment_is_a_file_of_a_payload_root_only(include, tmp_path):
    (tmp_path / "examples" / "project").mkdir(parents=True)
    (tmp_path / "examples" / "project" / "requirements.txt").write_text("numpy==2.4.6\n")
    (tmp_path / "other.txt").write_text("numpy==2.4.6\n")
    ok = AmiSettings(environment=str(tmp_path / "examples" / "project" / "requirements.txt"))
    assert ok.environment == str(tmp_path / "examples" / "project" / "requirements.txt")
    assert AmiSettings(environment="payloads/hello/main.py").environment == str(include / "payloads/hello/main.py")
    for outside in (str(tmp_path / "other.txt"), "../other.txt", "payloads/../../other.txt"):
        with pytest.raises(ValidationError, match="is not a file of include/payloads/ or examples/"):
            AmiSettings(environment=outside)


def test_a_symbolic_link_in_the_payload_is_refused(include):
    (include / "payloads/hello/secret").symlink_to("/etc/passwd")
    with pytest.raises(PayloadError, match="secret is not a plain file"):
        build_archive("hello")


def test_payload_root_is_under_the_shared_root_and_refuses_odd_roots():
    assert payload_root("/fsx") == "/fsx/pcflow/payloads"
    with pytest.raises(PayloadError, match="shared root"):
        payload_root("relative/dir")


def test_a_shipped_payload_runs_its_script_with_python_under_every_launcher():
    run_dir = RunDir.for_job("/fsx", "k1", "train")
    payload = "/fsx/pcflow/payloads/0123abcd"
    common = {"program": ["train.py", "--x", "a b"], "python": "/opt/venv/bin/python", "payload_dir": payload}
    for launcher, line in [
        ("srun", "srun --kill-on-bad-exit=1 /opt/venv/bin/python /fsx/pcflow/payloads/0123abcd/train.py --x 'a b' &"),
        ("mpirun", "/opt/venv/bin/python /fsx/pcflow/payloads/0123abcd/train.py --x 'a b' &"),
        ("torchrun", "--no-python /opt/venv/bin/python /fsx/pcflow/payloads/0123abcd/train.py --x 'a b' &"),
    ]:
        script = render_batch_script(JobSpec(launcher=launcher, **common), run_dir, job_name="k1.train", run_key="k1")
        assert line in script.splitlines() or any(ln.endswith(line) for ln in script.splitlines()), launcher
        assert "export PCFLOW_PAYLOAD_DIR=/fsx/pcflow/payloads/0123abcd" in script
    plain = render_batch_script(JobSpec(program=["/bin/true"]), run_dir, job_name="k1.train", run_key="k1")
    assert "srun --kill-on-bad-exit=1 /bin/true &" in plain and "PCFLOW_PAYLOAD_DIR" not in plain


@pytest.mark.parametrize("script", ["/etc/passwd", "../other/train.py", "lib/../../x.py"])
def test_a_payload_program_must_stay_inside_the_payload(script):
    with pytest.raises(ValidationError, match="path inside it"):
        JobSpec(program=[script], payload_dir="/fsx/pcflow/payloads/0123abcd")


def test_profiles_ship_the_payload_and_bake_only_its_environment():
    for profile in ("local", "aws-gpu"):
        spec = resolve_run_spec(profile)
        assert spec.training.payload == "simclr" and spec.training.program == ["train.py"]
        assert spec.ami.environment.endswith("examples/simclr/requirements.txt")
    with pytest.raises(RunSpecError, match="no directory 'nosuch'"):
        resolve_run_spec("local", {"training": {"payload": "nosuch"}})
    with pytest.raises(RunSpecError, match="a script inside the payload"):
        resolve_run_spec("local", {"training": {"program": ["/usr/bin/python3"]}})
