"""Every resume of a deferred pcflow task checks its trigger's event first: each malformed shape fails
the task with a message saying what was wrong, and an unsuccessful wait fails with the trigger's reason."""

from __future__ import annotations

import re

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from pcflow.errors import ConfigurationError, PcflowError, TriggerEventError, WaitFailed
from pcflow.events import require_success, validate_event


def test_a_missing_event_fails():
    with pytest.raises(TriggerEventError, match="ami resumed without an event"):
        validate_event(None, task="ami")


@pytest.mark.parametrize("event", ["success", ["status", "success"], 1])
def test_an_event_that_is_not_a_mapping_fails(event):
    with pytest.raises(TriggerEventError, match=re.escape(f"instead of a trigger event: {event!r}")):
        validate_event(event, task="ami")


@pytest.mark.parametrize("event", [{}, {"status": None}, {"status": "done"}, {"status": 200}])
def test_an_event_without_a_known_status_fails(event):
    with pytest.raises(TriggerEventError, match=r"status .* \(expected one of error, failed, success\)"):
        validate_event(event, task="ami")


def test_an_event_without_what_the_task_reads_fails():
    with pytest.raises(TriggerEventError, match="without job_id, run_dir"):
        validate_event({"status": "success"}, task="train", required=("job_id", "run_dir"))


def test_a_well_formed_event_is_returned_as_a_dict():
    event = {"status": "error", "message": "gone", "job_id": "7"}
    assert validate_event(event, task="train", required=("job_id",)) == event


def test_an_unsuccessful_wait_fails_with_the_triggers_message():
    with pytest.raises(WaitFailed, match="image ami-1 failed: image state: failed"):
        require_success({"status": "error", "message": "image state: failed"}, task="ami", what="image ami-1")
    assert require_success({"status": "success", "image_id": "ami-1"}, task="ami", what="image")["image_id"] == "ami-1"


def test_the_family_is_airflows_and_a_wrong_setting_is_not_retried():
    assert issubclass(PcflowError, AirflowException)
    assert issubclass(TriggerEventError, PcflowError) and issubclass(WaitFailed, PcflowError)
    assert issubclass(ConfigurationError, AirflowFailException) and issubclass(ConfigurationError, ValueError)
    assert not issubclass(WaitFailed, AirflowFailException)
