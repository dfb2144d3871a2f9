"""Every Slurm end state, read from a real sacct (or squeue) line, maps to one outcome and message
(pcflow.slurm.outcomes.END_STATES), the same for the waiter and the operator.

The lines are in end_states.txt beside this file: captured on the local stack where it can produce them,
written in sacct's documented format (and marked so) where it cannot.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowFailException

from pcflow.errors import JobFailed, JobFailedForGood
from pcflow.jobstates import JobInfo, JobState, parse_sacct, parse_squeue
from pcflow.slurm.operators import SlurmJobOperator
from pcflow.slurm.outcomes import (
    END_STATES,
    OTHER_END,
    Ending,
    JobOutputsMissing,
    Outcome,
    describe_end,
    output_problems,
)
from pcflow.slurm.watch import JobWatch, WatchPolicy

FIXTURE = Path(__file__).with_name("end_states.txt")


def lines() -> dict[str, tuple[str, str, str]]:
    """case -> (origin, command, line) from the fixture file."""
    found = {}
    for raw in FIXTURE.read_text().splitlines():
        if raw.strip() and not raw.startswith("#"):
            case, origin, command, line = raw.split("\t")
            found[case] = (origin, command, line)
    return found


def job(case: str) -> JobInfo:
    """The case's line, parsed as pcflow's queries parse it."""
    _, command, line = lines()[case]
    (info,) = parse_sacct(line) if command == "sacct" else parse_squeue(line)
    return info


def marker(info: JobInfo, exit_code: int, signal: str = "") -> dict:
    """The batch wrapper's exit marker for this job's attempt."""
    return {"job_id": info.job_id, "exit_code": exit_code, "restart": 0, "signal": signal}


def end_of(info: JobInfo, ended: tuple[int, str] | None):
    """The table's reading of the job, with the marker's exit code where Slurm's answer has none (squeue)."""
    code, signal = ended or (None, "")
    return describe_end(info, code if info.exit_code is None else None, signal)


# case, the wrapper's marker (exit code, signal) or None, the ending, the stored outcome, words of the message
CASES = [
    ("completed", None, Ending.SUCCEEDED, Outcome.SUCCESS, "completed"),
    ("oom_not_enforced", None, Ending.SUCCEEDED, Outcome.SUCCESS, "completed"),
    ("step_failed", None, Ending.SUCCEEDED, Outcome.SUCCESS, "completed"),
    ("completed_squeue", (0, ""), Ending.SUCCEEDED, Outcome.SUCCESS, "completed"),
    ("failed_exit_3", None, Ending.FAILED_RETRYABLE, Outcome.FAILED, "failed with exit code 3"),
    ("failed_squeue", (3, ""), Ending.FAILED_RETRYABLE, Outcome.FAILED, "failed with exit code 3"),
    ("killed_by_signal", None, Ending.FAILED_RETRYABLE, Outcome.FAILED, "killed by signal 9 (SIGKILL)"),
    ("timeout", None, Ending.FAILED_RETRYABLE, Outcome.FAILED, "Raise resources.time_limit"),
    ("timeout_squeue", (143, "TERM"), Ending.FAILED_RETRYABLE, Outcome.FAILED, "reached its time limit"),
    ("out_of_memory", None, Ending.FAILED_FINAL, Outcome.FAILED, "ran out of memory"),
    ("node_fail", None, Ending.FAILED_RETRYABLE, Outcome.FAILED, "lost a node"),
    ("preempted", None, Ending.FAILED_RETRYABLE, Outcome.FAILED, "was preempted"),
    ("boot_fail", None, Ending.FAILED_RETRYABLE, Outcome.FAILED, "failed to boot"),
    ("deadline", None, Ending.FAILED_FINAL, Outcome.FAILED, "missed its --deadline"),
    ("cancelled_by_admin", None, Ending.FAILED_FINAL, Outcome.FAILED, "by an administrator (uid 0, root)"),
    ("cancelled_by_user", (143, "TERM"), Ending.FAILED_FINAL, Outcome.FAILED, "by the user with uid 2950"),
    ("cancelled_squeue", None, Ending.FAILED_FINAL, Outcome.FAILED, "did not say by whom"),
    ("cancelled_by_user", (143, "early_stop"), Ending.STOPPED_ON_PURPOSE, Outcome.STOPPED_EARLY, "early_stop.json"),
    (
        "cancelled_squeue",
        (143, "budget_exhausted"),
        Ending.STOPPED_ON_PURPOSE,
        Outcome.BUDGET_EXHAUSTED,
        "budget_exhausted.json",
    ),
]


@pytest.mark.parametrize(("case", "ended", "ending", "outcome", "words"), CASES)
def test_each_end_state_has_one_outcome_and_a_message_saying_what_to_do(case, ended, ending, outcome, words):
    info = job(case)
    mark = marker(info, *ended) if ended else None
    # NODE_FAIL, PREEMPTED, BOOT_FAIL wait for a requeue first: no grace here, so the first look decides.
    verdict = JobWatch(info.job_id, WatchPolicy(interruption_grace=0)).assess(info, mark, 0)
    end = end_of(info, ended)
    assert (end.rule.ending, verdict.outcome) == (ending, outcome), verdict.message
    assert verdict.message == end.message and words in verdict.message, verdict.message
    assert verdict.retryable is (ending is not Ending.FAILED_FINAL)
    if ending in (Ending.FAILED_RETRYABLE, Ending.FAILED_FINAL):
        assert f"(Slurm state {info.raw_state})" in verdict.message
        assert end.rule.todo.format(job_id=info.job_id) in verdict.message


def test_the_fixture_covers_every_end_state_and_every_row():
    assert {job(case).state for case in lines()} >= {s for s in JobState if s.is_terminal}
    used = {end_of(job(case), ended).rule for case, ended, *_ in CASES}
    assert used == set(END_STATES.values())
    origins = {origin for origin, _, _ in lines().values()}
    assert origins == {"captured", "documented"}


def test_an_end_no_row_names_still_reads_as_a_failure_naming_the_state():
    end = describe_end(JobInfo("5", JobState.UNKNOWN, "SOMETHING_NEW", exit_code=1))
    assert end.rule is OTHER_END and end.outcome is Outcome.FAILED and "ended in state SOMETHING_NEW" in end.message


def test_a_forgotten_job_reads_its_marker_through_the_same_table():
    verdict = JobWatch("9").assess(None, {"job_id": "9", "exit_code": 137, "restart": 0, "signal": ""}, 0)
    assert (
        verdict.outcome is Outcome.FAILED and "SIGKILL" in verdict.message and "from its exit marker" in verdict.message
    )


# -- the operator: what the task does with each ending ------------------------------------------------------


class FakeHook:
    """The few head-node reads the operator's end makes: file sizes, the exit marker, a cancel."""

    def __init__(self, sizes: dict[str, int], marker: dict | None = None) -> None:
        self.sizes, self.marker, self.cancelled = sizes, marker, []

    def file_size(self, path: str) -> int | None:
        return self.sizes.get(path.rsplit("/", 1)[-1])

    def read_json(self, path: str) -> dict | None:
        return self.marker if path.endswith("/exit.json") else None

    def cancel(self, job_id: str) -> None:
        self.cancelled.append(job_id)


def operator(hook: FakeHook, outputs=("model.pt", "metrics.jsonl")) -> SlurmJobOperator:
    op = SlurmJobOperator(task_id="train", program=["true"], outputs=outputs)
    op.__dict__["hook"] = hook  # the cached property
    return op


def event(outcome: str, status: str, retryable: bool | None = None) -> dict:
    base = {"status": status, "outcome": outcome, "job_id": "7", "run_dir": "/fsx/r/train", "message": "Slurm job 7 …"}
    return {**base, "log_tail": ["last line"], **({} if retryable is None else {"retryable": retryable})}


def test_a_final_end_fails_without_retry_a_retryable_one_with_and_old_events_stay_retryable():
    op = operator(FakeHook({}))
    with pytest.raises(JobFailedForGood) as final:
        op.execute_complete({}, event("failed", "failed", retryable=False))
    assert isinstance(final.value, AirflowFailException) and "last line" in str(final.value)
    for retryable in (True, None):  # None: an event a trigger sent before `retryable` was
        with pytest.raises(JobFailed) as failure:
            op.execute_complete({}, event("failed", "failed", retryable=retryable))
        assert not isinstance(failure.value, AirflowFailException)


def test_without_retry_failed_jobs_a_failed_job_fails_for_good_but_a_lost_wait_is_retried():
    """The pipelines' train task (TRAIN_ARGS): retries that only the orchestrator's losses use. A job that
    failed, even in a way a retry could fix, fails the task for good (no second allocation); the wait's own
    error (it lost track of the job) stays retryable, for the retry to re-attach to the job."""
    from pcflow.pipeline.assembly import TRAIN_ARGS

    op = operator(FakeHook({}))
    op.retry_failed_jobs = TRAIN_ARGS["retry_failed_jobs"]
    assert TRAIN_ARGS["retries"] >= 1 and op.retry_failed_jobs is False
    with pytest.raises(JobFailedForGood) as final:
        op.execute_complete({}, event("failed", "failed", retryable=True))
    assert "clear it to submit it again" in str(final.value) and "last line" in str(final.value)
    with pytest.raises(JobFailed) as lost:
        op.execute_complete({}, event("error", "error", retryable=True))
    assert not isinstance(lost.value, AirflowFailException)


def test_a_completed_job_without_its_declared_outputs_fails_naming_them():
    recorded = {"job_id": "7", "exit_code": 0, "outputs": {"model.pt": 2048, "metrics.jsonl": 10}}
    complete = FakeHook({"model.pt": 2048, "metrics.jsonl": 10}, recorded)
    assert operator(complete).execute_complete({}, event("success", "success"))["outcome"] == "success"
    for sizes, words in [
        ({"metrics.jsonl": 10}, "its output model.pt does not exist"),
        ({"model.pt": 2048}, "its output metrics.jsonl does not exist"),
        ({"model.pt": 0, "metrics.jsonl": 10}, "its output model.pt is empty (0 bytes)"),
        ({"model.pt": 1000, "metrics.jsonl": 10}, "model.pt has 1000 bytes where the job's exit marker recorded 2048"),
    ]:
        with pytest.raises(JobOutputsMissing) as missing:
            operator(FakeHook(sizes, recorded)).execute_complete({}, event("success", "success"))
        assert words in str(missing.value) and isinstance(missing.value, AirflowFailException), str(missing.value)
    # A stop on purpose leaves what it left (no final model): not checked. Nothing declared: nothing checked.
    stopped = operator(FakeHook({})).execute_complete({}, event("stopped_early", "success"))
    assert stopped["outcome"] == "stopped_early"
    assert operator(FakeHook({}), outputs=()).execute_complete({}, event("success", "success"))["job_id"] == "7"


def test_output_problems_trusts_only_a_recorded_size():
    assert output_problems({"model.pt": 5}, {"model.pt": -1}) == []  # absent when the job ended, there now
    assert output_problems({"model.pt": 5}, {"model.pt": "5"}) == []  # not a number: not compared
    assert output_problems({"model.pt": 5}, {"model.pt": True}) == []
    assert output_problems({"model.pt": 5}, {}) == []
