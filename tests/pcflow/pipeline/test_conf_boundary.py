"""What a person who can trigger a DAG may change: only what the profile lists as overridable, within
its bounds. Each hostile conf of issue 14 is refused by the first task, offline (nothing exists yet),
with a message naming the field and who may change it. Settings that only an admin may set are
checked with the rules their stage applies later. Unit level: the module takes about 5 s."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowFailException
from stacktools import REPO

pytestmark = pytest.mark.security

ADMIN_ONLY = "only the deployment admin may change this (profile 'local')"
STACK_SSH = Path(os.environ.get("PCFLOW_STACK_DIR", REPO / ".stack")) / "ssh"
ADMIN_POLICY = [{"Policy": "arn:aws:iam::aws:policy/AdministratorAccess"}]


def extra_config(head_node: dict) -> dict:
    """A conf that lays `head_node` over the rendered ParallelCluster config's HeadNode."""
    return {"overrides": {"cluster": {"config": {"extra_config": {"HeadNode": head_node}}}}}


def refusal(validate, conf: dict, **kwargs) -> str:
    with pytest.raises(AirflowFailException) as refused:
        validate(conf, **kwargs)
    return str(refused.value)


def test_what_the_profile_lets_a_trigger_user_change_passes(offline, admin_profiles, schemaless_payload):
    conf = {
        "profile": admin_profiles.make("local", {"training": {"payload": schemaless_payload}}),
        "partition": "2026-11-29",
        "hyperparameters": {"epochs": 1, "lr": 0.01, "note": "{include}"},
        "instance_type": "c5.2xlarge",
        "capacity_type": "spot",
        "nodes": 2,
        "tasks_per_node": 1,
        "launcher": "torchrun",
        "early_stopping_patience": 3,
        "teardown_policy": "never",
        "overrides": {"metrics": {"early_stopping": {"min_delta": 0.01}}},
    }
    run = offline(conf)
    assert run["dataset"]["partition"] == "2026-11-29" and run["instance_type"] == "c5.2xlarge"
    assert run["training"]["hyperparameters"]["lr"] == 0.01 and run["training"]["launcher"] == "torchrun"
    assert run["training"]["hyperparameters"]["note"] == "{include}"  # expanded in profiles only
    assert run["early_stopping"]["patience"] == 3 and run["early_stopping"]["min_delta"] == 0.01
    assert run["keep_resources"] is True and run["stack"] == "local"


@pytest.mark.parametrize(
    ("conf", "complaint"),
    [
        # reading the worker's files
        ({"overrides": {"ami": {"bootstrap_script": "/etc/hostname"}}}, f"ami.bootstrap_script: {ADMIN_ONLY}"),
        ({"dataset_source": str(STACK_SSH)}, "dataset.source (form field 'dataset_source'): "),
        ({"dataset_source": "../.stack/ssh"}, "is not under a dataset root the profile allows"),
        ({"dataset_source": "builtin:../../etc"}, "is not a built-in dataset the profile allows"),
        ({"overrides": {"dataset": {"source": "s3://someone-elses-bucket/data"}}}, "not under a dataset root"),
        # admin rights for a job
        (
            extra_config({"Iam": {"AdditionalIamPolicies": ADMIN_POLICY}}),
            f"cluster.config.extra_config.HeadNode.Iam.AdditionalIamPolicies: {ADMIN_ONLY}",
        ),
        (
            extra_config({"CustomActions": {"OnNodeStart": {"Script": "s3://x/y.sh"}}}),
            "cluster.config.extra_config.HeadNode.CustomActions.OnNodeStart.Script: only the deployment admin",
        ),
        # other stacks' resources
        (
            {"overrides": {"cluster": {"config": {"tags": {"pcflow:expires": "never"}}}}},
            "cluster.config.tags.pcflow:expires: only",
        ),
        (
            {"overrides": {"cluster": {"config": {"allow_updates": True}}}},
            f"cluster.config.allow_updates: {ADMIN_ONLY}",
        ),
        ({"overrides": {"cluster": {"ssh_conn_id": "other_team"}}}, f"cluster.ssh_conn_id: {ADMIN_ONLY}"),
        ({"overrides": {"stack": "other-team"}}, f"stack: {ADMIN_ONLY}"),
        ({"stack": "other-team"}, "stack: not a field of this DAG's form"),
        ({"overrides": {"dataset": {"bucket": "pcflow-other-datasets"}}}, f"dataset.bucket: {ADMIN_ONLY}"),
        # the job's own fields: an admin's, and shell-adjacent
        ({"overrides": {"training": {"time_limit": "1:00:00\n#SBATCH --uid=0"}}}, f"training.time_limit: {ADMIN_ONLY}"),
        ({"overrides": {"training": {"env": {"A;touch /tmp/x": "1"}}}}, "training.env.A;touch /tmp/x: only the"),
        ({"overrides": {"training": {"python": "/tmp/evil/python"}}}, f"training.python: {ADMIN_ONLY}"),
        ({"overrides": {"training": {"python": "/bin/sh"}}}, f"training.python: {ADMIN_ONLY}"),
        ({"overrides": {"training": {"partition": "gpu; rm -rf /"}}}, f"training.partition: {ADMIN_ONLY}"),
        ({"overrides": {"dataset": {"prefix": "'..''/''..''/home'"}}}, f"dataset.prefix: {ADMIN_ONLY}"),
        # within the profile's bounds
        ({"nodes": 9}, "training.nodes (form field 'nodes'): 9 is outside what the profile allows (1 to 3)"),
        ({"gpus_per_node": 8}, "training.gpus_per_node (form field 'gpus_per_node'): 8 is outside"),
        ({"instance_type": "p5.48xlarge"}, "instance_type (form field 'instance_type'): 'p5.48xlarge' is not one"),
        ({"launcher": "vissl"}, "training.launcher (form field 'launcher'): 'vissl' is not one the profile allows"),
        ({"overrides": {"training": {"nodes": "2"}}}, "training.nodes (form field 'nodes'): '2' is not a number"),
        ({"overrides": {"training": {"nodes": True}}}, "(form field 'nodes'): True is not a number"),
        ({"overrides": {"training": {"nodes": float("nan")}}}, "(form field 'nodes'): nan is not a number"),
        # null: removing what the profile sets (issue 24: a budget of null ran with no cap at all)
        ({"overrides": {"budget": {"usd": None}}}, "budget.usd (form field 'budget_usd'): null would remove"),
        ({"overrides": {"training": {"hyperparameters": None}}}, "training.hyperparameters (form field"),
        ({"overrides": {"metrics": {"early_stopping": None}}}, "metrics.early_stopping: null would remove"),
        ({"overrides": {"teardown": {"policy": None}}}, "teardown.policy (form field 'teardown_policy'): null"),
        ({"overrides": {"dataset": {"partition": None}}}, "dataset.partition (form field 'partition'): null"),
        # pcflow's own hyperparameters: where the job reads its data
        ({"hyperparameters": {"data_dir": "/etc"}}, "training.hyperparameters.data_dir: pcflow sets this itself"),
        ({"overrides": {"training": {"hyperparameters": {"data_dir": "/"}}}}, "hyperparameters.data_dir: pcflow"),
    ],
)
def test_a_conf_beyond_the_profile_is_refused_naming_the_field(offline, conf, complaint):
    message = refusal(offline, {"partition": "p1", **conf})
    assert complaint in message
    if "only" in complaint:
        assert "a run's conf may change only" in message  # and says what a trigger user may change


def test_every_refused_field_is_named_at_once(offline):
    conf = {"nodes": 99, "overrides": {"region": "eu-west-1", "ttl_hours": 999, "training": {"python": "x"}}}
    message = refusal(offline, conf)
    for field in ("training.nodes", "region", "ttl_hours", "training.python"):
        assert f"\n  {field}" in message, field


def test_sweep_trials_and_grid_change_only_what_the_profile_allows(offline, admin_profiles):
    bounded = admin_profiles.make(
        "local",
        {"overridable": {"training.hyperparameters": None, "training.hyperparameters.lr": {"min": 0, "max": 1}}},
    )
    sweep = {"profile": bounded, "partition": "p1", "trials": [{"lr": 0.1}], "grid": {"lr": [0.01, 0.5]}}
    assert [t["lr"] for t in offline(sweep, sweep=True)["trials"]] == [0.01, 0.5]
    assert "training.hyperparameters.lr: 5 is outside" in refusal(offline, {**sweep, "trials": [{"lr": 5}]}, sweep=True)
    assert "training.hyperparameters.lr: 2 is outside" in refusal(
        offline, {**sweep, "grid": {"lr": [0.1, 2]}}, sweep=True
    )
    closed = admin_profiles.make("local", {"overridable": {"training.hyperparameters": {"one_of": [{}]}}})
    message = refusal(offline, {"profile": closed, "partition": "p1", "trials": [{"lr": 0.1}]}, sweep=True)
    assert "training.hyperparameters.lr: only the deployment admin may change this" not in message
    assert "training.hyperparameters (form field 'hyperparameters'): {'lr': 0.1} is not one the profile" in message


def test_a_trial_or_grid_point_cannot_set_pcflow_s_own_hyperparameters(offline):
    sweep = {"partition": "p1", "trials": [{"lr": 0.1}]}
    reserved = "training.hyperparameters.data_dir: pcflow sets this itself"
    assert reserved in refusal(offline, {**sweep, "trials": [{"data_dir": "/etc"}]}, sweep=True)
    assert reserved in refusal(offline, {**sweep, "grid": {"data_dir": ["/etc", "/root"]}}, sweep=True)


def test_not_even_a_profile_sets_pcflow_s_own_hyperparameters(offline, admin_profiles):
    profile = admin_profiles.make("local", {"training": {"hyperparameters": {"data_dir": "/data"}}})
    assert "hyperparameters.data_dir: pcflow sets this itself" in refusal(offline, {"profile": profile})


def test_no_conf_removes_or_exceeds_the_budget(offline, admin_profiles):
    """Absent (or a form field left empty) means the profile's budget; a hard maximum alone is a budget."""
    assert offline({"partition": "p1"})["cost"]["budget_usd"] == 5
    assert offline({"partition": "p1", "budget_usd": None})["cost"]["budget_usd"] == 5
    assert "null would remove" in refusal(offline, {"partition": "p1", "overrides": {"budget": {"usd": None}}})
    assert "above the profile's hard maximum" in refusal(offline, {"partition": "p1", "budget_usd": 51})
    capped = admin_profiles.make("local", {"budget": {"usd": None, "max_usd": 7}})
    assert offline({"profile": capped, "partition": "p1"})["cost"]["budget_usd"] == 7


def test_a_profile_without_an_overridable_section_allows_nothing(offline, admin_profiles):
    import yaml

    name = admin_profiles.make("local", {"dataset": {"partition": "fixed"}})
    path = admin_profiles.directory / f"{name}.yaml"
    document = yaml.safe_load(path.read_text())
    del document["overridable"]
    path.write_text(yaml.safe_dump(document))
    assert offline({"profile": name, "partition": None})["dataset"]["partition"] == "fixed"
    message = refusal(offline, {"profile": name, "partition": None, "nodes": 1})
    assert "training.nodes (form field 'nodes'): only the deployment admin may change this" in message
    assert "a run's conf may change only nothing" in message


@pytest.mark.parametrize(
    ("overridable", "complaint"),
    [
        ({"training.nodes": {"maximum": 3}}, "overridable.training.nodes: Extra inputs are not permitted"),
        ({"Training Nodes": {}}, "overridable: 'Training Nodes' is not a dotted setting path"),
        (["training.nodes"], "overridable: must map dotted setting paths to rules"),
    ],
)
def test_an_admins_mistake_in_the_overridable_section_is_named(offline, admin_profiles, overridable, complaint):
    name = admin_profiles.make("local", name="broken")
    import yaml

    path = admin_profiles.directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), "overridable": overridable}))
    assert f"profile 'broken': {complaint}" in refusal(offline, {"profile": name, "partition": "p1", "nodes": 1})


@pytest.mark.parametrize(
    ("settings", "complaint"),
    [
        # What the train task would refuse after network, image, data and cluster exist: refused first.
        ({"training": {"time_limit": "1:00:00\n#SBATCH --uid=0"}}, "training.time_limit: String should match pattern"),
        ({"training": {"env": {"A;touch /tmp/x": "1"}}}, "training.env: Value error, environment variable name"),
        (
            {"training": {"env": {"SLURM_JOB_ID": "1"}}},
            "training.env: Value error, environment variable 'SLURM_JOB_ID'",
        ),
        ({"training": {"python": "python3 -c 'import os'"}}, "training.python: Value error, python must be a command"),
        ({"training": {"launcher": "torchrun", "gpus_per_node": 4}}, "training: Value error, torchrun: tasks_per_node"),
        ({"training": {"partition": "gpu;x"}}, "training.partition: String should match pattern"),
        ({"cluster": {"config": {"partition": "compute", "mystery": 1}}}, "cluster.config: unknown static cluster"),
        (
            {"network": {"ssh_ingress_cidrs": ["0.0.0.0/0"]}},
            "network.ssh_ingress_cidrs: Value error, the list contains 0.0.0.0/0",
        ),
        ({"network": {"vpc_cidr": "10.0.0.0/33"}}, "network.vpc_cidr: Value error, invalid CIDR"),
        # bootstrap scripts come from include/ami only
        ({"ami": {"bootstrap_script": "/etc/hostname"}}, "ami.bootstrap_script: Value error, must be a path relative"),
        ({"ami": {"bootstrap_script": "ami/../../../../etc/hostname"}}, "ami.bootstrap_script: Value error, must be"),
        ({"ami": {"bootstrap_script": "profiles/local.yaml"}}, "is not in include/ami/"),
        ({"dataset": {"prefix": "datasets/../../home"}}, "dataset.prefix: Value error, invalid dataset prefix"),
    ],
)
def test_an_admins_settings_pass_the_rules_their_stage_applies(offline, admin_profiles, settings, complaint):
    name = admin_profiles.make("local", settings)
    assert complaint in refusal(offline, {"profile": name, "partition": "p1"})


def test_a_dataset_source_must_lie_under_a_root_and_hold_data(offline, admin_profiles, tmp_path):
    root = tmp_path / "datasets"
    (root / "digits" / "0").mkdir(parents=True)
    (root / "digits" / "0" / "a.png").write_bytes(b"png")
    (root / "empty").mkdir()
    (root / "ssh").symlink_to(STACK_SSH)  # a link out of the root is judged by where it leads
    name = admin_profiles.make("local", {"overridable": {"dataset.source": {"under": [str(root)]}}})

    def source(path: str) -> dict:
        return {"profile": name, "partition": "p1", "dataset_source": path}

    assert offline(source(str(root / "digits")))["dataset"]["source"] == str(root / "digits")
    assert "holds no files to load" in refusal(offline, source(str(root / "empty")))
    assert "is not a directory on this worker" in refusal(offline, source(str(root / "missing")))
    for outside in (root / "ssh", root / ".." / "datasets" / ".." / "datasets-x", tmp_path, Path("/etc")):
        assert "is not under a dataset root the profile allows" in refusal(offline, source(str(outside)))
    assert "builtin:digits" in refusal(offline, source("builtin:digits"))  # not in this profile's roots


def test_the_default_profile_comes_from_the_deployment(monkeypatch, admin_profiles):
    from pcflow.pipeline import training_params

    monkeypatch.delenv("PCFLOW_OFFERED_PROFILES", raising=False)  # unset: every profile found is offered
    monkeypatch.setenv("PCFLOW_DEFAULT_PROFILE", "aws-gpu")
    extra = admin_profiles.make("local", name="team-a")
    shipped = ["aws-gpu", "aws-gpu-rehearsal", "local"]  # include/profiles/, then the admin's
    profile = training_params()["profile"]
    assert profile.value == "aws-gpu" and profile.schema["enum"] == [*shipped, extra]
    monkeypatch.delenv("PCFLOW_DEFAULT_PROFILE")
    profile = training_params()["profile"]
    assert profile.value is None and profile.schema["enum"] == [None, *shipped, extra]


def test_the_form_offers_the_profiles_the_admin_offers(monkeypatch, admin_profiles):
    from pcflow.pipeline import training_params

    team = admin_profiles.make("local", name="team-a")
    monkeypatch.setenv("PCFLOW_OFFERED_PROFILES", f" {team}, aws-gpu,{team}")  # the admin's order, once each
    monkeypatch.setenv("PCFLOW_DEFAULT_PROFILE", "aws-gpu")
    profile = training_params()["profile"]
    assert profile.value == "aws-gpu" and profile.schema["enum"] == [team, "aws-gpu"]
    assert "offers: team-a, aws-gpu)" in profile.description
    monkeypatch.delenv("PCFLOW_DEFAULT_PROFILE")
    assert training_params()["profile"].schema["enum"] == [None, team, "aws-gpu"]
    monkeypatch.setenv("PCFLOW_OFFERED_PROFILES", "")  # empty is unset: every profile found
    assert training_params()["profile"].schema["enum"] == [None, "aws-gpu", "aws-gpu-rehearsal", "local", team]


def test_a_profile_the_admin_does_not_offer_is_refused_before_it_is_read(offline, monkeypatch):
    """The form's choices are fixed where and when the DAG was parsed; a conf from the CLI, the REST
    API, a backfill or a DAG serialized under another setting reaches the first task, which asks again."""
    import pcflow.runspec

    monkeypatch.setenv("PCFLOW_OFFERED_PROFILES", "local")
    assert offline({"profile": "local", "partition": "p1"})["profile"] == "local"

    def read(name, *args):
        raise AssertionError(f"profile {name!r} was read")

    monkeypatch.setattr(pcflow.runspec, "load_profile", read)
    for name in ("aws-gpu-rehearsal", "aws-gpu", "no-such-profile", ["local"]):
        complaint = refusal(offline, {"profile": name, "partition": "p1"})
        assert complaint == (
            f"profile: {name!r} is not offered on this deployment; choose one of local "
            "(the admin decides which, in PCFLOW_OFFERED_PROFILES)"
        )


@pytest.mark.parametrize(
    ("offered", "complaint"),
    [
        ("aws-gpu", "PCFLOW_DEFAULT_PROFILE: 'local' is not among the profiles PCFLOW_OFFERED_PROFILES offers"),
        ("local,aws-gpu-rehersal", "PCFLOW_OFFERED_PROFILES: no profile file for 'aws-gpu-rehersal' in "),  # misspelt
    ],
)
def test_a_worker_whose_offer_is_wrong_refuses_every_run(offline, monkeypatch, offered, complaint):
    """The DAG processor's setting fails the DAG files' import (tests/dags/test_parse.py); a worker's,
    where it differs, fails the first task of every run, the default profile's too."""
    from pcflow.paths import profile_names
    from pcflow.pipeline import form

    monkeypatch.setattr(form, "offered_profiles", profile_names)  # the form, as parsed under a good setting
    monkeypatch.setenv("PCFLOW_OFFERED_PROFILES", offered)
    assert complaint in refusal(offline, {"profile": "local", "partition": "p1"})


def test_a_run_without_a_profile_is_refused(offline):
    assert "profile: none chosen" in refusal(offline, {"profile": None, "partition": "p1"})
