"""A warm start resolves only to a model its stack's run recorded, with that run's sha256 (pcflow.warmstart),
and the first task refuses, without retries, what names no such record or whose bytes changed."""

from __future__ import annotations

import hashlib
import types

import boto3
import pytest
from moto import mock_aws
from run_factories import make_planned_run

from pcflow import warmstart
from pcflow.artifacts import ArtifactRefused
from pcflow.checks import check_warm_start
from pcflow.errors import PcflowInputError
from pcflow.lineage import MODEL, stack_asset

pytestmark = pytest.mark.security
BUCKET = "pcflow-local-datasets"
MODEL_BYTES = b"weights of the first run"
FIRST, SECOND, OTHER = "pretrain-manual-20261201t000000-aaaaaaaa", "pretrain-manual-20261202t000000-bbbbbbbb", "x-1"


def uri(run: str, name: str = "model.pt") -> str:
    return f"s3://{BUCKET}/runs/{run}/model/{name}"


def event(run: str, *, stack: str = "local", sha: str | None = None, sweep: bool = False):
    """A model event as the metrics stage emits it (run key, the model's URIs and sha256)."""
    model = {"model": uri(run), "model_sha256": sha, "checkpoint": uri(run, "checkpoints/epoch-0001.pt")}
    model["checkpoint_sha256"] = "c" * 64
    extra = {"run_key": run, "best": model} if sweep else {"run_key": run, "model": model}
    return types.SimpleNamespace(asset=types.SimpleNamespace(name=stack_asset(MODEL.name, stack).name), extra=extra)


class Accessor(list):
    """Airflow's inlet-events accessor as the first task uses it: newest first, limited."""

    def ascending(self, ascending: bool = True):
        assert ascending is False
        return self

    def limit(self, limit: int):
        assert limit == warmstart.MAX_EVENTS
        return self


def inlet_events(*events):
    return {MODEL: Accessor(events)}


SHA = hashlib.sha256(MODEL_BYTES).hexdigest()
EVENTS = [event(SECOND, sha="d" * 64), event(FIRST, sha=SHA), event(OTHER, stack="other", sha="e" * 64)]


def resolve(setting):
    return warmstart.resolve(setting, warmstart.stack_models(EVENTS, "local"), bucket=BUCKET)


def test_a_run_key_latest_or_uri_resolves_to_the_sha256_its_run_recorded():
    assert resolve(FIRST) == {"source": FIRST, "uri": uri(FIRST), "sha256": SHA, "run": FIRST}
    assert resolve("latest") == {"source": "latest", "uri": uri(SECOND), "sha256": "d" * 64, "run": SECOND}
    checkpoint = uri(FIRST, "checkpoints/epoch-0001.pt")
    assert resolve(checkpoint) == {"source": checkpoint, "uri": checkpoint, "sha256": "c" * 64, "run": FIRST}
    assert resolve(None) == warmstart.NOTHING
    # A sweep's event names its best trial's model.
    (best,) = warmstart.stack_models([event(FIRST, sha=SHA, sweep=True)], "local")
    assert best.model == uri(FIRST) and best.files[uri(FIRST)] == SHA


def test_latest_in_a_stack_without_a_model_trains_from_scratch_and_says_so():
    found = warmstart.resolve(
        "latest", warmstart.stack_models([event(OTHER, stack="other", sha="e" * 64)], "local"), bucket=BUCKET
    )
    assert found == {**warmstart.NOTHING, "source": "latest"}


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ("pretrain-manual-20261203t000000-cccccccc", "kept no model in this stack"),  # an unknown run key
        (OTHER, "kept no model in this stack"),  # another stack's run
        (f"s3://another-bucket/runs/{FIRST}/model/model.pt", "is not a model this stack's runs write"),
        (f"s3://{BUCKET}/datasets/digits/x.pt", "is not a model this stack's runs write"),
        (f"s3://{BUCKET}/runs/{FIRST}/model/../../{SECOND}/model/model.pt", "is not a model this stack's runs write"),
        (uri(FIRST, "checkpoints/epoch-0002.pt"), "recorded no sha256 for it"),  # no record of that file
    ],
)
def test_a_setting_with_no_record_in_the_stack_is_refused(setting, complaint):
    with pytest.raises(warmstart.Unrecorded, match=complaint):
        resolve(setting)


def test_a_record_that_points_outside_the_stacks_layout_is_refused():
    """An event's URI is checked against the layout too: the run's own bucket and `runs/<its key>/model/`."""
    strays = [event(FIRST, sha=SHA)]
    strays[0].extra["model"]["model"] = f"s3://another-bucket/runs/{FIRST}/model/model.pt"
    strays[0].extra["model"]["model_sha256"] = SHA
    models = warmstart.stack_models(strays, "local")
    with pytest.raises(warmstart.Unrecorded, match="not a model this stack's runs write"):
        warmstart.resolve(FIRST, models, bucket=BUCKET)
    assert warmstart.resolve("latest", models, bucket=BUCKET)["uri"] is None


def test_a_run_that_recorded_no_checksum_is_refused():
    models = warmstart.stack_models([event(FIRST, sha=None)], "local")
    with pytest.raises(warmstart.Unrecorded, match="recorded no sha256"):
        warmstart.resolve(FIRST, models, bucket=BUCKET)
    assert warmstart.resolve("latest", models, bucket=BUCKET)["uri"] is None  # never a model without its hash


@pytest.fixture
def s3(monkeypatch):
    """moto in this process, the first task's S3 client pointed at it (the stack's endpoint taken out)."""
    for variable in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_CA_BUNDLE"):
        monkeypatch.delenv(variable, raising=False)
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        client.put_object(Bucket=BUCKET, Key=f"runs/{FIRST}/model/model.pt", Body=MODEL_BYTES)
        monkeypatch.setattr("pcflow.aws.clients.aws_client", lambda *args, **kwargs: client)
        yield client


def run_document(setting: str | None):
    """The local profile's planned run with `training.warm_start` set, its data in BUCKET."""
    return make_planned_run(
        "local", stack="local", region="us-east-1", dataset={"bucket": BUCKET}, training={"warm_start": setting}
    )


def test_the_first_task_verifies_the_bytes_and_records_the_warm_start(s3):
    run = run_document(FIRST)
    assert check_warm_start(run, inlet_events(*EVENTS)) == {
        "source": FIRST,
        "uri": uri(FIRST),
        "sha256": SHA,
        "run": FIRST,
    }


def test_a_changed_object_is_refused_not_retried_naming_the_setting(s3):
    s3.put_object(Bucket=BUCKET, Key=f"runs/{FIRST}/model/model.pt", Body=b"someone else's pickle")
    run = run_document(FIRST)
    with pytest.raises(ArtifactRefused) as refused:
        check_warm_start(run, inlet_events(*EVENTS))
    assert isinstance(refused.value, PcflowInputError)  # Airflow's fail-without-retry
    message = str(refused.value)
    assert message.startswith("training.warm_start: ") and "a trigger user may change this" in message
    assert "sha256" in message


def test_an_unknown_run_key_is_refused_before_any_download(s3, monkeypatch):
    monkeypatch.setattr(warmstart, "verify", lambda *args: pytest.fail("downloaded without a record"))
    with pytest.raises(PcflowInputError, match=r"training\.warm_start: run 'x-2' kept no model"):
        check_warm_start(run_document("x-2"), inlet_events(*EVENTS))


def test_a_recorded_object_that_is_gone_is_refused(s3):
    s3.delete_object(Bucket=BUCKET, Key=f"runs/{FIRST}/model/model.pt")
    with pytest.raises(PcflowInputError, match="no longer exists"):
        check_warm_start(run_document(FIRST), inlet_events(*EVENTS))


def test_validate_refuses_a_warm_start_with_no_record_and_the_nightly_continues_from_latest(offline):
    # The first task itself: no model events in its inlet (a fresh stack), so a run key has no record.
    with pytest.raises(PcflowInputError, match=r"training\.warm_start: run 'nope' kept no model"):
        offline({"overrides": {"training": {"warm_start": "nope"}}})
    assert offline({})["warm_start"] == warmstart.NOTHING  # pretrain: the profile names none


def test_the_nightly_takes_the_profiles_warm_start_unless_its_conf_names_one(form):
    from taskcontext import FakeTI

    from pcflow.pipeline.settings import resolve_for_run

    context = {"ti": FakeTI(dag_id="pretrain_nightly", run_id="manual__1", task_id="validate")}
    nightly = resolve_for_run(form({"profile": "local"}), context, nightly=True)
    assert nightly.training.warm_start == "latest"  # local.yaml's nightly.warm_start
    named = resolve_for_run(
        form({"profile": "local", "overrides": {"training": {"warm_start": FIRST}}}), context, nightly=True
    )
    assert named.training.warm_start == FIRST
    assert resolve_for_run(form({"profile": "local"}), context).training.warm_start is None


def test_a_profile_that_does_not_list_it_refuses_it_naming_the_admin(admin_profiles, offline):
    import yaml

    from pcflow.paths import include_dir

    local = yaml.safe_load((include_dir() / "profiles" / "local.yaml").read_text())
    overridable = {k: v for k, v in local["overridable"].items() if k != "training.warm_start"}
    profile = admin_profiles.make("local", name="nowarm")
    path = admin_profiles.directory / f"{profile}.yaml"
    document = yaml.safe_load(path.read_text())
    document["overridable"] = overridable
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(PcflowInputError, match=r"training\.warm_start.*only the deployment admin"):
        offline({"profile": profile, "overrides": {"training": {"warm_start": "latest"}}})


def test_latest_passes_over_a_model_that_is_gone_but_never_one_that_changed(s3):
    """The nightly's `latest`: the newest model (SECOND's) was deleted, so the one before it (FIRST's, whose
    bytes verify) is taken; with that gone too, the run starts from scratch instead of failing every night;
    bytes that changed are refused, not passed over."""
    run = run_document("latest")  # SECOND's object was never written: gone
    assert check_warm_start(run, inlet_events(*EVENTS)) == {
        "source": "latest",
        "uri": uri(FIRST),
        "sha256": SHA,
        "run": FIRST,
    }
    s3.put_object(Bucket=BUCKET, Key=f"runs/{FIRST}/model/model.pt", Body=b"someone else's pickle")
    with pytest.raises(ArtifactRefused, match="sha256"):
        check_warm_start(run_document("latest"), inlet_events(*EVENTS))
    s3.delete_object(Bucket=BUCKET, Key=f"runs/{FIRST}/model/model.pt")
    assert check_warm_start(run_document("latest"), inlet_events(*EVENTS)) == {**warmstart.NOTHING, "source": "latest"}
