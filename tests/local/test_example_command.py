"""include/local/example.py (`make example`): the example's bare repository (one deterministic commit per
content), the conf it triggers `pretrain` with, and the summary it prints from what the tasks returned."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import example
import pytest
from dagrun import DagRunResult

from pcflow.runspec import TrainingSettings, check_conf, resolve_run_spec


def tree_of(repo: Path, ref: str = "main") -> list[str]:
    return example.git("ls-tree", "-r", "--name-only", ref, git_dir=repo).splitlines()


def test_an_unchanged_folder_is_the_same_commit_in_any_repository(tmp_path: Path):
    first = example.publish(example.EXAMPLES / "resnet", tmp_path / "a" / "resnet.git")
    again = example.publish(example.EXAMPLES / "resnet", tmp_path / "a" / "resnet.git")
    elsewhere = example.publish(example.EXAMPLES / "resnet", tmp_path / "b" / "resnet.git")
    assert first == again == elsewhere, "fixed author, committer and date: same content, same commit"
    assert example.git("symbolic-ref", "HEAD", git_dir=tmp_path / "a" / "resnet.git") == "refs/heads/main"
    assert example.git(
        "ls-remote", "--", (tmp_path / "a" / "resnet.git").as_uri(), "main", git_dir=tmp_path / "a" / "resnet.git"
    ).startswith(first)
    assert 0 <= example.resolve_seconds(tmp_path / "a" / "resnet.git") < 60
    assert {"train.py", "requirements.txt", "hparams.schema.json", "README.md"} <= set(
        tree_of(tmp_path / "a" / "resnet.git")
    )


def test_a_changed_folder_is_a_new_commit_on_top_and_ignored_files_stay_out(tmp_path: Path):
    folder = tmp_path / "resnet"
    shutil.copytree(example.EXAMPLES / "resnet", folder, ignore=shutil.ignore_patterns("__pycache__"))
    repo = tmp_path / "resnet.git"
    before = example.publish(folder, repo)
    (folder / "NOTES.md").write_text("a change\n")
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0")
    (folder / "runs").mkdir()
    (folder / "runs" / "model.pt").write_bytes(b"\0")
    after = example.publish(folder, repo)
    assert after != before
    assert example.git("rev-parse", f"{after}^", git_dir=repo) == before, "the earlier commit stays resolvable"
    files = tree_of(repo)
    assert "NOTES.md" in files and not [f for f in files if f.startswith(("__pycache__", "runs/"))]
    assert example.publish(folder, repo) == after


def test_the_conf_is_the_shared_shape_and_the_local_profile_lets_a_user_send_it(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("PCFLOW_STACK_DIR", str(tmp_path))  # `{stack}`: where the profile lets git code come from
    repo = tmp_path / "examples" / "resnet.git"
    example.publish(example.EXAMPLES / "resnet", repo)
    conf = example.conf_for("resnet", repo)
    training = conf["overrides"]["training"]
    assert conf["profile"] == "local"
    assert "payload" not in training and training["code"] == {"git": {"url": repo.resolve().as_uri(), "ref": "main"}}
    assert training["program"] == ["train.py"] and training["requirements"] == "requirements.txt"
    assert conf["overrides"]["dataset"]["mode"] == "shard" and conf["overrides"]["metrics"]["objective"] == "accuracy"
    ours = {**conf["overrides"], "training": {"hyperparameters": training["hyperparameters"]}}
    check_conf("local", ours)  # what this branch's profile must allow: the dataset mode, objective, hyperparameters
    if not {"code", "requirements"} <= set(TrainingSettings.model_fields):
        pytest.skip("training.code / training.requirements are not settings yet (issue 26's code and env parts)")
    check_conf("local", conf["overrides"])


def test_in_a_container_the_image_is_the_environment_and_the_profile_lets_a_user_send_it(tmp_path: Path):
    repo = tmp_path / "examples" / "resnet.git"
    image = "oci:/images/debian-python3:bookworm-python3"
    training = example.conf_for("resnet", repo, container=image)["overrides"]["training"]
    assert training["container"] == {"image": image, "python": str(example.PAYLOAD_PYTHON)}
    assert "requirements" not in training, "a run in a container builds no environment: refused with requirements"
    assert training["program"] == ["train.py"]
    assert "requirements" in example.conf_for("resnet", repo)["overrides"]["training"], "without one: built"
    check_conf("local", {"training": {"container": training["container"]}})


def test_the_hyperparameters_the_job_gets_pass_the_projects_schema():
    """The profile's hyperparameters are merged under the conf's: none may be one the project refuses."""
    conf = example.conf_for("resnet", Path("/nowhere/resnet.git"))
    overrides = {k: v for k, v in conf["overrides"].items() if k != "training"}
    overrides["training"] = {"hyperparameters": conf["overrides"]["training"]["hyperparameters"]}
    sent = {**resolve_run_spec("local", overrides).training.hyperparameters, "data_dir": "/shared/datasets/x"}
    spec = importlib.util.spec_from_file_location(
        "resnet_example_hparams_conf", example.EXAMPLES / "resnet" / "hparams.py"
    )
    hparams = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hparams)
    assert hparams.problems(sent, hparams.load_schema()) == []


def recorded(uploaded: int, built: bool) -> DagRunResult:
    """What a run's tasks return (SHAPE26.md), as the XComs of a real run hold them."""
    returned = {
        "validate": {"run_key": "pretrain-20260101-abc"},
        "ship_payload": {
            "name": None,
            "digest": "sha256-" + "ab" * 32,
            "dir": "/shared/pcflow/code/x",
            "reused": not uploaded,
            "source": "git",
            "url": "file:///s/examples/resnet.git",
            "commit": "08d57f2f" * 5,
            "dirty": False,
            "bytes": 30720,
            "files": 12,
            "uploaded_bytes": uploaded,
        },
        "prepare_environment": {
            "id": "env-1234",
            "dir": "/shared/pcflow/envs/env-1234",
            "python": "p",
            "built": built,
            "build_s": 14.2 if built else 0.0,
        },
        "metrics": {"objective": {"name": "accuracy", "value": 0.97}},
    }
    states = {task: "success" for task in (*returned, "check_environment", "train")}
    return DagRunResult("pretrain", "manual__x", "success", states, returned, 60.0)


def test_the_summary_says_what_the_code_path_did_and_cost(monkeypatch):
    monkeypatch.setattr(example, "left_tagged", lambda result: [])
    seconds = {
        "validate": 1.5,
        "ship_payload": 2.0,
        "prepare_environment": 0.5,
        "check_environment": 0.25,
        "train": 40.0,
    }
    first = example.summarize_code(recorded(30720, built=True), seconds, 61.0, 0.05)
    assert first["code_path_s"] == {
        **{"resolve": 0.05, "ship_payload": 2.0, "prepare_environment": 0.5, "check_environment": 0.25},
        "total": 2.8,
    }, "train not counted, validate's AWS checks not counted"
    assert first["validate_s"] == 1.5
    assert first["code"]["commit"] == "08d57f2f" * 5 and first["uploaded_bytes"] == 30720
    ok, line = example.verdict("resnet", first)
    assert ok and "30720 bytes uploaded, environment built, image not imported, code path 2.8 s" in line
    assert "accuracy 0.97" in line and "code sha256-ababa" in line
    ok, line = example.verdict("resnet", example.summarize_code(recorded(0, built=False), seconds, 30.0, 0.05))
    assert ok and "0 bytes uploaded, environment reused" in line


def test_a_run_that_left_resources_is_not_ok(monkeypatch):
    monkeypatch.setattr(example, "left_tagged", lambda result: ["vpc vpc-1"])
    ok, line = example.verdict("resnet", example.summarize_code(recorded(0, built=False), {}, 1.0, 0.05))
    assert not ok and line.startswith("pcflow example resnet: FAILED") and "1 resources left" in line


def test_git_runs_without_this_machines_configuration(tmp_path: Path, monkeypatch):
    """A user's commit.gpgSign or hooks would change (or fail) the commit: example.py ignores them."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text("[commit]\n\tgpgSign = true\n[gpg]\n\tprogram = /bin/false\n")
    monkeypatch.setenv("HOME", str(home))
    assert example.publish(example.EXAMPLES / "resnet", tmp_path / "r.git") == example.publish(
        example.EXAMPLES / "resnet", tmp_path / "s.git"
    )
    assert (
        subprocess.run(["git", "--git-dir", str(tmp_path / "r.git"), "fsck", "--no-progress"], check=False).returncode
        == 0
    )


@pytest.mark.parametrize("name", sorted(p.parent.name for p in example.EXAMPLES.glob(f"*/{example.RUNS_FILE}")))
def test_every_examples_conf_trains_its_own_code_and_sends_what_its_schema_accepts(name, tmp_path, monkeypatch):
    """`make example EXAMPLE=<name>` for each project (resnet, simclr): the conf the local profile lets a user
    send, the run's code from the project's repository in place of the profile's payload, and hyperparameters
    (the profile's merged under the project's) that the project's own schema accepts."""
    import jsonschema

    monkeypatch.setenv("PCFLOW_STACK_DIR", str(tmp_path))
    repo = tmp_path / "examples" / f"{name}.git"
    example.publish(example.EXAMPLES / name, repo)
    conf = example.conf_for(name, repo)
    check_conf("local", conf["overrides"])
    spec = resolve_run_spec("local", conf["overrides"])
    assert spec.training.payload is None and spec.training.code.git.url == repo.resolve().as_uri()
    assert spec.training.requirements == "requirements.txt" and spec.training.program == ["train.py"]
    assert {"train.py", "requirements.txt", "hparams.schema.json", "README.md"} <= set(tree_of(repo))
    schema = json.loads((example.EXAMPLES / name / "hparams.schema.json").read_text())
    sent = {**spec.training.hyperparameters, "data_dir": "/shared/datasets/x"}
    assert [error.message for error in jsonschema.Draft202012Validator(schema).iter_errors(sent)] == []
