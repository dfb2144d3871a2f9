"""Parsing squeue, sacct and scontrol into one state model."""

from __future__ import annotations

import pytest

from pcflow.jobstates import (
    JobInfo,
    JobState,
    normalise_state,
    parse_duration,
    parse_exit_code,
    parse_sacct,
    parse_scontrol,
    parse_squeue,
)


@pytest.mark.parametrize(
    ("raw", "state"),
    [
        ("PENDING", JobState.PENDING),
        ("PD", JobState.PENDING),
        ("COMPLETING", JobState.RUNNING),
        ("CANCELLED by 1000", JobState.CANCELLED),
        ("cancelled+", JobState.CANCELLED),
        ("NODE_FAIL", JobState.NODE_FAIL),
        ("OUT_OF_MEMORY", JobState.OUT_OF_MEMORY),
        ("REQUEUE_HOLD", JobState.REQUEUED),
        ("", JobState.UNKNOWN),
        ("SOMETHING_NEW", JobState.UNKNOWN),
    ],
)
def test_normalise_state(raw, state):
    assert normalise_state(raw) is state


def test_state_groups():
    assert JobState.REQUEUED.is_active and not JobState.REQUEUED.is_terminal
    assert JobState.NODE_FAIL.is_interruption and JobState.NODE_FAIL.is_terminal
    assert not JobState.TIMEOUT.is_interruption


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("45", 45), ("1:05", 65), ("1:02:03", 3723), ("2-01:00:00", 176400), ("0:00", 0), ("bad", None), ("", None)],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


def test_parse_exit_code():
    assert parse_exit_code("1:0") == (1, 0)
    assert parse_exit_code("0:9") == (0, 9)
    assert parse_exit_code("") == (None, None)


def test_parse_squeue():
    out = "42|RUNNING|None|1|k.train|1:05|node-[1-2]|\n43|PENDING|Resources|0|k.eval|0:00|(null)|\n"
    running, pending = parse_squeue(out)
    assert running == JobInfo(
        "42", JobState.RUNNING, "RUNNING", "k.train", None, None, "", 1, 65, "node-[1-2]", "squeue"
    )
    assert pending.reason == "Resources" and pending.nodes == ""


def test_parse_sacct_folds_requeued_attempts():
    out = (
        "7|k.train|NODE_FAIL|0:0|30|n1|None\n"
        "7|k.train|COMPLETED|0:0|95|n2|None\n"
        "8|k.eval|FAILED|3:0|4|n1|NonZeroExitCode\n"
    )
    seven, eight = parse_sacct(out)
    assert (seven.state, seven.restarts, seven.elapsed_s, seven.nodes) == (JobState.COMPLETED, 1, 95, "n2")
    assert (eight.state, eight.exit_code, eight.reason) == (JobState.FAILED, 3, "NonZeroExitCode")


def test_parse_scontrol_with_spaces_in_values():
    out = (
        "JobId=12 JobName=my job ArrayJobId=12 JobState=TIMEOUT Reason=TimeLimit Dependency=(null) "
        "Requeue=1 Restarts=2 BatchFlag=1 ExitCode=0:15 RunTime=00:10:00 NodeList=vm Command=/a b/c.sh\n"
    )
    info = parse_scontrol(out)
    assert info.name == "my job" and info.state is JobState.TIMEOUT
    assert (info.restarts, info.exit_code, info.signal, info.elapsed_s) == (2, 0, 15, 600)
    assert parse_scontrol("slurm_load_jobs error: Invalid job id specified") is None


def test_job_info_round_trips_through_json():
    info = JobInfo("1", JobState.FAILED, "FAILED", exit_code=2)
    assert JobInfo.from_dict(info.as_dict()) == info
