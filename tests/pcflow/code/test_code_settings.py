"""`training.code` in the run document (runspec, trust): exactly one source, never beside a payload, a
directory or repository only under the profile's roots, the bundle's limits the admin's alone, and the
entry point a script in the code or `pkg.module:function`."""

from __future__ import annotations

import pytest

from pcflow.profiles import RunSpecError
from pcflow.runspec import check_conf, resolve_run_spec
from pcflow.trust import url_under

pytestmark = pytest.mark.security


@pytest.fixture
def stack(tmp_path, monkeypatch):
    (tmp_path / "examples" / "proj").mkdir(parents=True)
    monkeypatch.setenv("PCFLOW_STACK_DIR", str(tmp_path))
    return tmp_path


def code(**source) -> dict:
    return {"training": {"code": source, "program": ["train.py"]}}


def test_a_conf_naming_code_replaces_the_profiles_payload(stack):
    conf = code(dir=str(stack / "examples" / "proj"))
    check_conf("local", conf)
    run = resolve_run_spec("local", conf)
    assert run.training.payload is None and run.training.code.kind == "dir"



def test_other_code_starts_from_its_own_hyperparameters_not_the_profiles(stack):
    """aws-gpu's hyperparameters are SimCLR's (`temperature`): a ResNet project's schema refuses that name, so a
    ResNet run on aws-gpu was refused before it started. The profile's values go with the profile's code."""
    profile = resolve_run_spec("aws-gpu", {}).training
    assert profile.hyperparameters["temperature"] == 0.1 and profile.payload == "simclr"
    resnet = {"git": {"url": "https://github.com/my-org/resnet.git"}}
    own = {"training": {"code": resnet, "hyperparameters": {"depth": 50}}}
    assert resolve_run_spec("aws-gpu", own).training.hyperparameters == {"depth": 50}
    assert resolve_run_spec("aws-gpu", {"training": {"payload": "resnet"}}).training.hyperparameters == {}
    same = resolve_run_spec("aws-gpu", {"training": {"payload": "simclr", "hyperparameters": {"lr": 1.0}}}).training
    assert same.hyperparameters == {**profile.hyperparameters, "lr": 1.0}  # the profile's own code keeps them


@pytest.mark.parametrize(
    ("conf", "complaint"),
    [
        (code(dir="/etc"), "training.code.dir: '/etc' is not under"),
        (code(git={"url": "file:///etc/repo.git"}), "training.code.git.url: 'file:///etc/repo.git' is not under"),
        (code(git={"url": "https://github.com/someone/repo.git"}), "training.code.git.url: 'https://github.com"),
        (code(git={"url": "file://{stack}/examples/../../x.git"}), "is not under a URL the profile allows"),
        ({"training": {"bundle": {"allow_secrets": True}}}, "training.bundle.allow_secrets: only the deployment admin"),
        ({"training": {"bundle": {"max_mib": 4096}}}, "training.bundle.max_mib: only the deployment admin"),
        (code(git={"url": "file://{stack}/examples/p.git", "commit": "0" * 40}), "training.code.git.commit: only"),
        (code(git={"url": "file://{stack}/examples/p.git", "conn_id": "aws_default"}), "training.code.git.conn_id"),
    ],
)
def test_what_a_trigger_user_may_not_name_is_refused_before_spend(stack, conf, complaint):
    text = str(conf).replace("{stack}", str(stack))
    import ast

    with pytest.raises(RunSpecError, match="may not change") as refused:
        check_conf("local", ast.literal_eval(text))
    assert complaint.replace("{stack}", str(stack)) in str(refused.value)


@pytest.mark.parametrize(
    ("training", "complaint"),
    [
        ({"code": {"dir": "/x", "s3": "s3://b-b-b/k.tar"}}, "name exactly one of git, dir or s3 (got dir, s3)"),
        ({"code": {}}, "name exactly one of git, dir or s3 (got none)"),
        ({"code": {"dir": "relative"}}, "must be an absolute directory"),
        ({"code": {"dir": "/x"}, "payload": "simclr"}, "payload and code are two sources"),
        ({"code": {"dir": "/x"}, "program": ["../up.py"]}, "program[0] must be a script inside the code"),
        ({"code": {"git": {"url": "ext::sh -c id"}}}, "is not a git URL pcflow fetches"),
        ({"code": {"git": {"url": "https://h/r.git", "ref": "--upload-pack=x"}}}, "is not a git branch"),
    ],
)
def test_a_malformed_code_setting_is_refused_naming_the_field(training, complaint):
    from pcflow.runspec import TrainingSettings

    with pytest.raises(ValueError) as refused:
        TrainingSettings.model_validate({"program": ["train.py"], **training})
    assert complaint in str(refused.value)


def test_an_entry_point_names_a_function_in_the_code():
    from pcflow.runspec import TrainingSettings

    settings = TrainingSettings.model_validate({"program": ["pkg.train:main", "--x"], "code": {"dir": "/x"}})
    assert settings.program[0] == "pkg.train:main"


def test_urls_are_under_a_root_by_whole_segments_only(tmp_path):
    assert url_under("https://github.com/org/repo.git", "https://github.com/org")
    assert not url_under("https://github.com/organisation/repo.git", "https://github.com/org")
    assert not url_under("https://github.com/org/../other/r.git", "https://github.com/org")
    assert not url_under("https://evil.example/org/r.git", "https://github.com/org")
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "link").symlink_to("/etc")
    assert url_under(f"file://{tmp_path}/root/r.git", f"file://{tmp_path}/root")
    assert not url_under(f"file://{tmp_path}/root/link/r.git", f"file://{tmp_path}/root")
