"""pcflow/lineage.py without a stack: which Assets the stages name, the nightly's schedule from its profile
(a cron, or the stack's dataset), which partition a run started by new data trains on, and when a load
is new content. The events themselves, on real runs: tests/dags/test_nightly_on_data.py and
tests/pcflow/dataset/test_operator.py."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import pytest
from airflow.sdk import Asset

from pcflow.dataset.partition import resolve_partition
from pcflow.lineage import DATASET, announced_partition, dataset_asset, is_new_content, nightly_schedule
from pcflow.profiles import RunSpecError
from pcflow.runspec import check_conf, resolve_run_spec


def test_the_nightly_runs_at_its_profiles_cron_or_on_its_stacks_data(admin_profiles):
    assert nightly_schedule("local") == nightly_schedule("aws-gpu-rehearsal") == "0 2 * * *"
    assert nightly_schedule(admin_profiles.make("local", {"nightly": {"cron": "30 3 * * *"}})) == "30 3 * * *"
    on_data = nightly_schedule(admin_profiles.make("local", {"nightly": {"schedule": "data"}}))
    assert on_data == Asset(name="pcflow-dataset-local", uri="x-pcflow://local/pcflow-dataset")
    assert nightly_schedule(admin_profiles.make("aws-gpu", {"nightly": {"schedule": "data"}})) == dataset_asset(
        "research"
    )


def test_a_bad_nightly_setting_names_its_field(admin_profiles):
    with pytest.raises(RunSpecError, match=r"nightly\.schedule: 'hourly' is not one of clock, data"):
        nightly_schedule(admin_profiles.make("local", {"nightly": {"schedule": "hourly"}}))
    with pytest.raises(RunSpecError, match=r"nightly\.cron: Value error, '0 2 \* \*' is not a cron expression"):
        resolve_run_spec(admin_profiles.make("local", {"nightly": {"cron": "0 2 * *"}}))
    with pytest.raises(RunSpecError, match=r"nightly\.schedule: only the deployment admin may change this"):
        check_conf("local", {"nightly": {"schedule": "data"}})  # a trigger user's conf


def test_the_nightly_dag_scheduled_on_data_and_the_stages_that_name_the_dataset(admin_profiles, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag
    from dagrun import REPO

    monkeypatch.setenv("PCFLOW_DEFAULT_PROFILE", admin_profiles.make("local", {"nightly": {"schedule": "data"}}))
    dag = DagBag(dag_folder=str(REPO / "dags" / "pretrain_nightly.py")).dags["pretrain_nightly"]
    assert type(dag.timetable).__name__ == "AssetTriggeredTimetable"
    assert dag.timetable.asset_condition == dataset_asset("local")
    assert dag.get_task("dataset").outlets == [DATASET]
    assert dag.get_task("train").inlets == dag.get_task("metrics").inlets == [DATASET]
    assert [outlet.name for outlet in dag.get_task("metrics").outlets] == ["pcflow-pretrained-encoder"]


def event(extra: dict, hour: int, partition_key: str | None = None) -> SimpleNamespace:
    timestamp = dt.datetime(2026, 11, 29, hour, tzinfo=dt.UTC)
    return SimpleNamespace(extra=extra, timestamp=timestamp, partition_key=partition_key)


def test_a_run_started_by_new_data_trains_on_the_newest_partition_announced():
    through_alias = event({"partition": "2026-11-29"}, 1)
    newest = event({}, 3, partition_key="2026-11-30")  # posted through the REST API with a partition key
    context = {"triggering_asset_events": {"asset": [through_alias, event({"other": 1}, 4)], "alias": [through_alias]}}
    assert announced_partition(context) == "2026-11-29"
    context["triggering_asset_events"]["asset"].append(newest)
    assert announced_partition(context) == "2026-11-30"
    assert announced_partition({}) is None and announced_partition({"triggering_asset_events": None}) is None


def test_who_announces_a_partition_chooses_it_as_a_trigger_user_would(admin_profiles):
    profile = admin_profiles.make("local", {"overridable": {"dataset.partition": {"one_of": ["2026-11-29"]}}})
    context = {
        "params": {"profile": profile},
        "triggering_asset_events": {"asset": [event({"partition": "2026-11-29"}, 1)]},
    }
    assert resolve_partition(context) == "2026-11-29"
    context["triggering_asset_events"]["asset"].append(event({"partition": "2026-11-30"}, 2))
    assert announced_partition(context) == "2026-11-30"  # what the event names; whether it may, the stage checks
    with pytest.raises(RunSpecError, match=r"dataset\.partition: '2026-11-30' is not one the profile allows"):
        resolve_partition(context)


def test_new_content_is_what_this_run_committed():
    assert is_new_content({"manifest_written": True, "committed_by": "run-a"}, "run-a")
    assert is_new_content({"manifest_written": False, "committed_by": "run-a"}, "run-a")  # its retry
    assert not is_new_content({"manifest_written": False, "committed_by": "run-a"}, "run-b")
