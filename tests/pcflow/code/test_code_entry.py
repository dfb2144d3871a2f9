"""How a job runs the code (slurm.spec, render): `pkg.module:function` imported from the staged code and
called with the program's arguments; hyperparameters as `--key value` arguments when asked and always in
$PCFLOW_HPARAMS_JSON; and the first task pins a git ref in the run document."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_code_sources import commit, sh

from pcflow.slurm.render import render_batch_script
from pcflow.slurm.spec import RUN_ENTRY_POINT, JobSpec, RunDir


def test_an_entry_point_is_called_from_the_staged_code_with_the_programs_arguments(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text("import sys\ndef main():\n    print(sys.argv)\n    return 3\n")
    spec = JobSpec(program=["pkg.train:main", "--x", "a b"], python=sys.executable, payload_dir=str(tmp_path))
    assert spec.command == [sys.executable, "-c", RUN_ENTRY_POINT, str(tmp_path), "pkg.train:main", "--x", "a b"]
    done = subprocess.run(spec.command, capture_output=True, text=True, cwd="/", check=False)
    assert done.returncode == 3 and done.stdout.strip() == "['pkg.train:main', '--x', 'a b']"


def test_hyperparameter_arguments_are_rendered_only_when_asked_and_never_as_shell_text(tmp_path):
    run_dir = RunDir.for_job("/fsx", "k1", "train")
    common = {"program": ["train.py"], "python": "python3", "payload_dir": "/fsx/pcflow/payloads/abc"}
    plain = render_batch_script(JobSpec(**common), run_dir, job_name="k1.train", run_key="k1")
    assert "hp_args" not in plain and "export PCFLOW_HPARAMS_JSON" in plain
    for launcher in ("srun", "torchrun", "mpirun"):
        spec = JobSpec(launcher=launcher, hyperparameter_args=True, **common)
        script = render_batch_script(spec, run_dir, job_name="k1.train", run_key="k1")
        assert "mapfile -d '' -t hp_args" in script
        assert any(line.endswith('/fsx/pcflow/payloads/abc/train.py "${hp_args[@]}" &') for line in script.splitlines())
    # The argument reader as the script runs it, on a hostile value: one argument each, nothing run.
    hparams = tmp_path / "hparams.json"
    hparams.write_text(json.dumps({"lr": 0.1, "name": "$(touch pwned) x", "layers": [1, 2]}))
    reader = script.split("mapfile -d '' -t hp_args < <(python3 ", 1)[1].split(' "$PCFLOW_HPARAMS")', 1)[0]
    bash = f'mapfile -d "" -t hp_args < <(python3 {reader} "$1"); printf "%s\\n" "${{hp_args[@]}}"'
    out = subprocess.run(
        ["bash", "-c", bash, "bash", str(hparams)], check=False, capture_output=True, text=True, cwd=tmp_path
    )
    assert out.stdout.splitlines() == ["--layers", "[1, 2]", "--lr", "0.1", "--name", "$(touch pwned) x"]
    assert not (tmp_path / "pwned").exists()


@pytest.fixture
def examples(tmp_path, monkeypatch):
    """A bare repository under the local profile's example root (`{stack}/examples`)."""
    monkeypatch.setenv("PCFLOW_STACK_DIR", str(tmp_path))
    work = tmp_path / "work"
    work.mkdir()
    sh("git", "init", "-q", "-b", "main", cwd=work)
    head = commit(work, "train.py", "print(1)\n")
    sh("git", "clone", "-q", "--bare", str(work), str(tmp_path / "examples" / "proj.git"), cwd=tmp_path)
    return f"file://{tmp_path}/examples/proj.git", head


def test_the_first_task_pins_the_ref_to_a_commit_and_refuses_one_that_does_not_exist(offline, examples):
    url, head = examples
    conf = {"partition": "p1", "overrides": {"training": {"code": {"git": {"url": url, "ref": "main"}}}}}
    run = offline(conf)
    assert run["training"]["code"]["git"]["commit"] == head and run["training"]["payload"] is None
    conf["overrides"]["training"]["code"]["git"]["ref"] = "nope"
    with pytest.raises(Exception, match=r"training\.code\.git\.ref: .*has no branch or tag 'nope'"):
        offline(conf)
    by_form = offline({"partition": "p1", "code_git_url": url, "code_git_ref": head})  # the trigger form's fields
    assert by_form["training"]["code"]["git"] == {**by_form["training"]["code"]["git"], "url": url, "commit": head}


def test_the_run_records_the_code_it_trained_and_none_when_it_shipped_none():
    from pcflow.lineage import code_extra

    shipped = {"name": "proj", "digest": "abc", "dir": "/fsx/x", "source": "git", "url": "file:///r.git"}
    shipped |= {"commit": "c" * 40, "dirty": False, "bytes": 10240, "files": 2, "uploaded_bytes": 0, "reused": True}
    extra = code_extra(shipped)
    assert extra["commit"] == "c" * 40 and extra["uploaded_bytes"] == 0 and "dir" not in extra
    assert code_extra({"name": None, "digest": None}) is None and code_extra("not a dict") is None
