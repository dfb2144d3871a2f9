"""Batch scripts: one template per launcher, quoting everywhere the shell reads, strict #SBATCH values."""

from __future__ import annotations

import subprocess

import jinja2
import pytest
from pydantic import ValidationError

from pcflow.slurm.render import render_batch_script, render_hparams
from pcflow.slurm.spec import JobSpec, Resources, RunDir

RUN_DIR = RunDir.for_job("/fsx", "pretrain-k1", "train")


def render(**kw) -> str:
    spec = JobSpec(**{"program": ["train.py"], **kw})
    return render_batch_script(spec, RUN_DIR, job_name="pretrain-k1.train", run_key="pretrain-k1")


def directives(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH")]


@pytest.mark.parametrize("launcher", ["srun", "torchrun", "vissl", "mpirun"])
def test_every_launcher_renders_valid_bash(launcher, tmp_path):
    script = render(launcher=launcher, env={"NCCL_DEBUG": "INFO"}, resources=Resources(nodes=2, tasks_per_node=4))
    assert script.startswith("#!/bin/bash\n#SBATCH ")
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)
    assert "--job-name=pretrain-k1.train" in directives(script)
    assert f"--output={RUN_DIR.log}" in directives(script)


def test_resources_become_directives():
    res = Resources(
        nodes=8,
        tasks_per_node=8,
        gpus_per_node=8,
        cpus_per_task=6,
        partition="gpu",
        time_limit="2-00:00:00",
        exclusive=True,
        requeue=False,
        extra_sbatch={"account": "ml-research", "constraint": "a100"},
    )
    torchrun = directives(render(launcher="torchrun", resources=res))
    assert {"--nodes=8", "--ntasks-per-node=1", "--cpus-per-task=48", "--gpus-per-node=8"} <= set(torchrun)
    assert {"--partition=gpu", "--time=2-00:00:00", "--exclusive", "--no-requeue"} <= set(torchrun)
    assert {"--account=ml-research", "--constraint=a100"} <= set(torchrun)
    srun = directives(render(launcher="srun", resources=res))
    assert {"--ntasks-per-node=8", "--cpus-per-task=6"} <= set(srun)


def test_shell_values_are_quoted():
    script = render(program=["train.py", "$(id)", "a b"], env={"X": "`id`; rm -rf /"})
    assert "train.py '$(id)' 'a b'" in script
    assert "rm -rf" not in script  # the environment travels with sbatch, never in the script (test_secrets.py)


@pytest.mark.parametrize(
    "bad",
    [
        {"resources": {"extra_sbatch": {"uid": "0"}}},
        {"resources": {"extra_sbatch": {"account": "a b"}}},
        {"resources": {"extra_sbatch": {"account": "x\n#SBATCH --uid=0"}}},
        {"resources": {"partition": "gpu;id"}},
        {"resources": {"time_limit": "1 day"}},
        {"resources": {"tasks_per_node": 0}},
        {"env": {"1X": "v"}},
        {"env": {"PCFLOW_RUN_DIR": "/tmp"}},
        {"hyperparameters": {"lr": float("nan")}},
        {"python": "/opt/venv/bin/python; id"},
        {"launcher": "torchrun", "resources": {"tasks_per_node": 4, "gpus_per_node": 8}},
        {"program": []},
    ],
)
def test_bad_specs_are_refused(bad):
    with pytest.raises(ValidationError):
        JobSpec(**{"program": ["train.py"], **bad})


def test_refused_options_are_named_with_the_allowed_ones():
    with pytest.raises(ValidationError, match=r"not allowed: uid.*Allowed extras: account"):
        Resources(extra_sbatch={"uid": "0"})


def test_run_dir_refuses_unsafe_roots():
    for root in ["relative/path", "/with space", "/a;b", ""]:
        with pytest.raises(ValueError, match="shared root"):
            RunDir.for_job(root, "k", "t")


def test_hparams_are_json():
    assert render_hparams(JobSpec(program=["x"], hyperparameters={"b": 1, "a": "q'\""})) == (
        '{\n  "a": "q\'\\"",\n  "b": 1\n}\n'
    )


def test_missing_template_is_a_clear_error(monkeypatch):
    from pcflow.slurm import render as render_module

    monkeypatch.setattr(render_module, "_environment", lambda: jinja2.Environment(loader=jinja2.DictLoader({})))
    with pytest.raises(FileNotFoundError, match="no batch template for launcher 'srun'"):
        render()


def test_a_warm_start_reaches_the_job_as_its_path_quoted_and_nothing_else():
    path = "/fsx/pcflow/runs/pretrain-k1/warm_start/model.pt"
    assert f"export PCFLOW_WARM_START={path}\n" in render(warm_start=path)
    assert "PCFLOW_WARM_START" not in render()
    with pytest.raises(ValidationError):
        render(warm_start="/fsx/x.pt; id")  # only a plain absolute path reaches the shell
