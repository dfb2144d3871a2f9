"""A project's declared hyperparameters (pcflow.code.hparams): the first task reads the code's
`hparams.schema.json` (examples/resnet's) where the run's code is (a directory, a git commit, an S3 bundle,
the bucket's record of a commit) and refuses an unknown name, a wrong type, a value out of bounds, in the
run's hyperparameters and in each sweep trial and grid point, naming the setting and who may change it; a
schema that is not one is refused as the project's to fix; a code without one is not checked; the trigger
form lists a local code's schema."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from run_factories import make_planned_run
from test_code_sources import commit, sh

from pcflow.code.hparams import MISSING, Case, code_schema, parse_schema, problems, recorded_schema
from pcflow.code.schema_file import MAX_SCHEMA_BYTES, SchemaRefused, local_summary
from pcflow.code.upload import commit_key, record_commit
from pcflow.errors import PcflowInputError

RESNET = Path(__file__).resolve().parents[3] / "examples" / "resnet"
SCHEMA = json.loads((RESNET / "hparams.schema.json").read_text())
LIMITS = {"max_mib": 1, "allow_secrets": False}
#: The local profile's hyperparameters, which the resnet schema allows.
GOOD = {"epochs": 1, "batch_size": 8, "lr": 0.01, "seed": 0}


def check(cases: list[Case]) -> list[tuple[str, str]]:
    return problems(SCHEMA, cases, data_dir="data_dir", where="hparams.schema.json")


def test_unknown_names_wrong_types_and_values_out_of_bounds_are_named_by_their_setting():
    found = dict(check([Case({**GOOD, "lr": 1000, "width": "8", "bogus": 1})]))
    assert set(found) == {
        "training.hyperparameters.lr",
        "training.hyperparameters.width",
        "training.hyperparameters.bogus",
    }
    assert "1000 is greater than the maximum of 100" in found["training.hyperparameters.lr"]
    assert "'8' is not of type 'integer'" in found["training.hyperparameters.width"]
    assert found["training.hyperparameters.bogus"].startswith("not a hyperparameter of the code's schema (it lists:")
    assert check([Case(GOOD)]) == []


def test_a_bad_trial_or_grid_value_names_where_it_came_from():
    cases = [
        Case({**GOOD, "depth": 50}, {"depth": "trials[0].depth"}, whole="trials[0]"),
        Case({**GOOD, "depth": 13}, {"depth": "trials[1].depth"}, whole="trials[1]"),
        Case({**GOOD, "depth": 50, "lr": -1}, {"depth": "trials[2].depth", "lr": "grid.lr"}, whole="trials[2]"),
    ]
    assert [setting for setting, _ in check(cases)] == ["trials[1].depth", "grid.lr"]


@pytest.mark.parametrize(
    ("data", "complaint"),
    [
        (b"{not json", "is not JSON"),
        (b"[1, 2]", "is not a JSON schema object"),
        (
            json.dumps({"type": "object", "properties": {"lr": {"type": "decimal"}}}).encode(),
            "is not a valid JSON schema",
        ),
        (json.dumps({"patternProperties": {"^x": {}}}).encode(), "patternProperties is not supported"),
        (b" " * (MAX_SCHEMA_BYTES + 1), f"over the cap of {MAX_SCHEMA_BYTES}"),
    ],
)
def test_a_schema_that_is_not_one_is_refused(data, complaint):
    with pytest.raises(SchemaRefused, match=complaint):
        parse_schema(data, "hparams.schema.json")


@pytest.mark.parametrize(
    ("schema", "complaint"),
    [
        ({"$ref": "https://example.invalid/schema.json"}, "cannot be used: Unresolvable"),  # never fetched
        ({"properties": {"name": {"pattern": "(a)\\1"}}}, "is not one RE2 takes"),  # RE2: linear time
        ({"properties": {"x": {}}, "additionalProperties": False}, "refuses 'data_dir', which pcflow sets itself"),
    ],
)
def test_a_schema_that_cannot_check_the_values_is_the_schemas_fault(schema, complaint):
    with pytest.raises(SchemaRefused, match=complaint):
        problems(schema, [Case({"name": "aa", "x": 1})], data_dir="data_dir", where="hparams.schema.json")


def resnet_run(offline, **training):
    conf = {
        "partition": "p1",
        "overrides": {"training": {"code": {"dir": str(RESNET)}, "program": ["train.py"], **training}},
    }
    return offline(conf)


def test_the_first_task_refuses_a_value_the_code_does_not_allow_before_spend(offline):
    assert resnet_run(offline, hyperparameters={"depth": 14})["training"]["hyperparameters"]["depth"] == 14
    with pytest.raises(PcflowInputError) as refused:
        resnet_run(offline, hyperparameters={"depth": 13, "momentum": 0.9})
    message = str(refused.value)
    assert "training.hyperparameters.depth: 13 is not one of [14, 26, 50, 101, 152]; a trigger user may" in message
    assert "training.hyperparameters.momentum: not a hyperparameter of the code's schema" in message


def test_the_first_task_checks_every_trial_of_a_sweep(offline):
    conf = {
        "partition": "p1",
        "trials": [{"depth": 14}, {"depth": 15}],
        "grid": {"width": [8, 1000]},
        "overrides": {"training": {"code": {"dir": str(RESNET)}, "program": ["train.py"]}},
    }
    with pytest.raises(PcflowInputError) as refused:
        offline(conf, sweep=True)
    lines = str(refused.value).splitlines()[1:]
    assert [line.split(":")[0].strip() for line in lines] == ["grid.width", "trials[1].depth"]
    assert all("a trigger user may change this, within the bounds profile 'local' sets" in line for line in lines)
    conf["grid"] = {"width": list(range(1000, 1030))}  # 31 refusals (a grid value once for both trials): 20 listed
    with pytest.raises(PcflowInputError) as refused:
        offline(conf, sweep=True)
    assert len(str(refused.value).splitlines()) == 1 + 20 + 1 and str(refused.value).endswith("and 11 more")


def test_reserved_names_are_refused_first(offline):
    with pytest.raises(PcflowInputError, match=r"training\.hyperparameters\.data_dir: pcflow sets this itself"):
        resnet_run(offline, hyperparameters={"data_dir": "/etc", "depth": 13})


def test_no_schema_no_check_and_a_named_one_that_is_missing_is_refused(offline, tmp_path, monkeypatch):
    monkeypatch.setenv("PCFLOW_STACK_DIR", str(tmp_path))  # {stack}/examples: a directory the local profile allows
    project = tmp_path / "examples" / "plain"
    project.mkdir(parents=True)
    (project / "train.py").write_text("print(1)\n")
    overrides = {"code": {"dir": str(project)}, "program": ["train.py"], "hyperparameters": {"anything": [1]}}
    assert offline({"partition": "p1", "overrides": {"training": overrides}})["training"]["hyperparameters"]["anything"]
    with pytest.raises(PcflowInputError, match=r"training\.hparams_schema: conf/hp\.json in .*: no such file"):
        offline({"partition": "p1", "overrides": {"training": {**overrides, "hparams_schema": "conf/hp.json"}}})
    (project / "conf").mkdir()
    (project / "conf" / "hp.json").write_text('{"properties": {"anything": {"type": "integer"}}}')
    with pytest.raises(PcflowInputError, match=r"training\.hyperparameters\.anything: \[1\] is not of type 'integer'"):
        offline({"partition": "p1", "overrides": {"training": {**overrides, "hparams_schema": "conf/hp.json"}}})
    (project / "hparams.schema.json").write_text('{"type": "nope"}')
    with pytest.raises(PcflowInputError, match=r"training\.code: .*not a valid JSON schema.*its author fixes it"):
        offline({"partition": "p1", "overrides": {"training": overrides}})


@pytest.fixture
def git_project(tmp_path):
    """A bare repository whose `proj/` holds the resnet schema, and its commit."""
    work = tmp_path / "work"
    work.mkdir()
    sh("git", "init", "-q", "-b", "main", cwd=work)
    commit(work, "proj/train.py", "print(1)\n")
    head = commit(work, "proj/hparams.schema.json", json.dumps(SCHEMA))
    sh("git", "clone", "-q", "--bare", str(work), str(tmp_path / "remote.git"), cwd=tmp_path)
    return f"file://{tmp_path / 'remote.git'}", head


def code_run(code: dict, **training):
    """A planned run of this `training.code`, its bundle within LIMITS, its data in hp-bucket."""
    training = {"code": code, "bundle": LIMITS, "hyperparameters": {}, **training}
    return make_planned_run("local", dataset={"bucket": "hp-bucket"}, training=training)


def git_run(url, head, **training):
    return code_run({"git": {"url": url, "ref": "main", "subdir": "proj", "commit": head}}, **training)


def test_a_git_commits_schema_is_read_from_the_commit_then_from_the_bucket_record(git_project, s3):
    url, head = git_project
    run = git_run(url, head)
    assert recorded_schema(run, lambda: s3, "hparams.schema.json") is MISSING  # a first run: no bucket yet
    s3.create_bucket(Bucket="hp-bucket")
    assert recorded_schema(run, lambda: s3, "hparams.schema.json") is MISSING  # no record yet
    where, data = code_schema(run, lambda: s3)
    assert json.loads(data) == SCHEMA and where == f"hparams.schema.json in {url} at {head}"
    assert code_schema(git_run(url, head, hparams_schema="other.json"), lambda: s3)[1] is None

    class Bundle:
        name, digest, sha256, files, data, content_bytes, checksums = "proj", "d" * 20, "d" * 64, 1, b"x", 1, b""

    key = commit_key(url, head, "proj", LIMITS)
    record_commit(s3, "hp-bucket", key, Bundle, stack="s", hparams_schema={"path": "hparams.schema.json", "text": "{}"})
    remote = Path(url.removeprefix("file://"))
    (remote / "objects").rename(remote / "gone")  # a fetch would fail now: the record answers
    assert code_schema(run, lambda: s3)[1] == b"{}"


def test_an_s3_bundles_schema_is_read_from_the_tar(s3):
    s3.create_bucket(Bucket="code")
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        data = json.dumps(SCHEMA).encode()
        info = tarfile.TarInfo("./hparams.schema.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    s3.put_object(Bucket="code", Key="p.tar.gz", Body=raw.getvalue())
    run = code_run({"s3": "s3://code/p.tar.gz"})
    assert json.loads(code_schema(run, lambda: s3)[1]) == SCHEMA


def test_the_form_lists_a_local_codes_schema_and_not_a_remote_ones(admin_profiles, monkeypatch):
    from pcflow.pipeline.form import hyperparameters_description

    listed = local_summary({"code": {"dir": str(RESNET)}})
    assert "depth (integer, one of 14, 26, 50, 101, 152, default 50)" in listed
    assert "lr (number, (0, 100], default 0.1)" in listed and listed.endswith("; no other names")
    assert local_summary({"code": {"git": {"url": "https://github.com/o/r"}}}) is None
    assert "temperature (number" in local_summary({"payload": "simclr"})  # examples/simclr, the profiles' payload
    assert local_summary({"payload": "no-such-payload"}) is None
    training = {"payload": None, "code": {"dir": str(RESNET)}, "program": ["train.py"]}
    monkeypatch.setenv("PCFLOW_DEFAULT_PROFILE", admin_profiles.make("local", {"training": training}))
    assert "code declares: data_dir (string" in hyperparameters_description()
    monkeypatch.setenv("PCFLOW_DEFAULT_PROFILE", "local")  # the shipped default: SimCLR's schema
    assert "code declares: data_dir (string" in hyperparameters_description()
    assert "temperature (number" in hyperparameters_description()
    git = {"payload": None, "code": {"git": {"url": "https://github.com/o/r", "ref": "main"}}, "program": ["t.py"]}
    monkeypatch.setenv("PCFLOW_DEFAULT_PROFILE", admin_profiles.make("local", {"training": git}))
    assert "declares" not in hyperparameters_description()
