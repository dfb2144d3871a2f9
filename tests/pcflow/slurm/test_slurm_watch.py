"""When a waiter decides that a job is over, and how it reports it."""

from __future__ import annotations

from pcflow.jobstates import JobInfo, JobState
from pcflow.slurm.progress import ArrayProgress, JobProgress, explain_reason
from pcflow.slurm.watch import ArrayWatch, JobWatch, LogCursor, Outcome, WatchPolicy, marker_job_info


def info(state: JobState, raw: str | None = None, **kw) -> JobInfo:
    return JobInfo(job_id="9", state=state, raw_state=raw or str(state), **kw)


def test_running_then_completed():
    watch = JobWatch("9")
    assert watch.assess(info(JobState.RUNNING), None, 0) is None
    verdict = watch.assess(info(JobState.COMPLETED, exit_code=0), None, 5)
    assert verdict.outcome is Outcome.SUCCESS and verdict.exit_code == 0


def test_completing_with_marker_ends_without_waiting_for_epilogs():
    watch = JobWatch("9")
    marker = {"job_id": "9", "exit_code": 0, "restart": 0}
    assert watch.assess(info(JobState.RUNNING, "COMPLETING"), marker, 0).outcome is Outcome.SUCCESS
    failed = JobWatch("9").assess(info(JobState.RUNNING, "COMPLETING"), {**marker, "exit_code": 4}, 0)
    assert failed.outcome is Outcome.FAILED and failed.exit_code == 4


def test_marker_of_an_earlier_attempt_is_ignored():
    old = {"job_id": "9", "exit_code": 143, "restart": 0, "signal": "TERM"}
    assert JobWatch("9").assess(info(JobState.RUNNING, "COMPLETING", restarts=1), old, 0) is None


def test_failures_name_their_cause():
    cases = {
        JobState.TIMEOUT: "time limit",
        JobState.OUT_OF_MEMORY: "out of memory",
        JobState.CANCELLED: "cancelled",
        JobState.FAILED: "exit code 2",
    }
    for state, words in cases.items():
        verdict = JobWatch("9").assess(info(state, exit_code=2), None, 0)
        assert verdict.outcome is Outcome.FAILED and words in verdict.message, (state, verdict.message)


def test_a_job_stopped_by_the_early_stopping_check_is_not_a_failure():
    stop = {"job_id": "9", "exit_code": 143, "restart": 0, "signal": "early_stop"}
    verdict = JobWatch("9").assess(info(JobState.CANCELLED), stop, 0)
    assert verdict.outcome is Outcome.STOPPED_EARLY and verdict.outcome.ok and "stopped early" in verdict.message
    assert JobWatch("9").assess(None, stop, 0).outcome is Outcome.STOPPED_EARLY  # slurmctld forgot it
    assert JobWatch("9").assess(info(JobState.CANCELLED), {**stop, "signal": "TERM"}, 0).outcome is Outcome.FAILED
    # In a sweep, a trial stopped early counts as done, not failed, even when every trial must succeed.
    elements = [JobInfo("9_0", JobState.COMPLETED, exit_code=0), JobInfo("9_1", JobState.CANCELLED)]
    array = ArrayWatch("9", 2, WatchPolicy(), min_success_ratio=1.0)
    verdict = array.assess(elements, {1: {**stop, "job_id": "9_1"}}, 0)
    assert verdict.outcome is Outcome.SUCCESS and [e["outcome"] for e in verdict.elements] == [
        "success",
        "stopped_early",
    ]


def test_requeue_is_progress_until_too_many_restarts():
    watch = JobWatch("9", WatchPolicy(max_restarts=2))
    assert watch.assess(info(JobState.NODE_FAIL), None, 0) is None  # Slurm is about to requeue
    assert watch.assess(info(JobState.PENDING, restarts=1), None, 1) is None
    assert watch.assess(info(JobState.RUNNING, restarts=2), None, 2) is None
    verdict = watch.assess(info(JobState.RUNNING, restarts=3), None, 3)
    assert verdict.outcome is Outcome.TOO_MANY_RESTARTS and verdict.outcome.needs_cancel


def test_interruption_without_requeue_fails_after_the_grace_period():
    watch = JobWatch("9", WatchPolicy(interruption_grace=60))
    assert watch.assess(info(JobState.PREEMPTED), None, 0) is None
    assert watch.assess(info(JobState.PREEMPTED), None, 59) is None
    verdict = watch.assess(info(JobState.PREEMPTED), None, 61)
    assert verdict.outcome is Outcome.FAILED and "preempted" in verdict.message


def test_failed_after_a_term_marker_waits_for_a_requeue():
    term = {"job_id": "9", "exit_code": 143, "restart": 0, "signal": "TERM"}
    watch = JobWatch("9", WatchPolicy(interruption_grace=60))
    assert watch.assess(info(JobState.FAILED, exit_code=0), term, 0) is None
    assert watch.assess(info(JobState.PENDING, restarts=1), term, 5) is None  # requeued: keeps waiting
    verdict = JobWatch("9", WatchPolicy(interruption_grace=60)).assess(info(JobState.FAILED), term, 0)
    assert verdict is None
    plain = {**term, "signal": ""}
    assert JobWatch("9").assess(info(JobState.FAILED), plain, 0).outcome is Outcome.FAILED
    # slurmctld may already count the restart while it still shows the requeued attempt as FAILED
    assert JobWatch("9").assess(info(JobState.FAILED, restarts=1), term, 0) is None
    two_back = {**term, "restart": 0}
    assert JobWatch("9").assess(info(JobState.FAILED, restarts=2), two_back, 0).outcome is Outcome.FAILED


def test_pending_timeout_counts_from_first_pending_sight():
    watch = JobWatch("9", WatchPolicy(pending_timeout=10))
    assert watch.assess(info(JobState.PENDING, reason="Resources"), None, 100) is None
    assert watch.assess(info(JobState.PENDING, reason="Resources"), None, 109) is None
    verdict = watch.assess(info(JobState.PENDING, reason="Resources"), None, 111)
    assert verdict.outcome is Outcome.PENDING_TIMEOUT and "Resources" in verdict.message


def test_forgotten_job_is_judged_by_its_marker():
    assert JobWatch("9").assess(None, {"job_id": "9", "exit_code": 0}, 0).outcome is Outcome.SUCCESS
    assert JobWatch("9").assess(None, {"job_id": "9", "exit_code": 1}, 0).outcome is Outcome.FAILED
    assert JobWatch("9").assess(None, {"job_id": "8", "exit_code": 0}, 0).outcome is Outcome.LOST
    assert JobWatch("9").assess(None, None, 0).outcome is Outcome.LOST


def test_log_cursor_delivers_whole_lines_once():
    cursor = LogCursor(tail_size=3)
    assert cursor.feed(b"a\nb") == ["a"]
    assert cursor.feed(b"c\nd\n") == ["bc", "d"]
    assert cursor.feed(b"") == []
    assert cursor.feed("é\nlast".encode()) == ["é"]
    assert cursor.flush() == ["last"] and cursor.flush() == []
    assert cursor.offset == len("a\nbc\nd\né\nlast".encode())
    assert list(cursor.tail) == ["d", "é", "last"]


def test_a_clean_marker_settles_between_questions_any_other_end_waits_for_slurm():
    clean = {"job_id": "9", "exit_code": 0, "restart": 0, "signal": "", "nodes": "n[1-2]", "elapsed_s": 12}
    assert JobWatch("9").settle(clean, None).outcome is Outcome.SUCCESS  # not asked yet
    assert JobWatch("9").settle(clean, info(JobState.RUNNING)).outcome is Outcome.SUCCESS
    assert JobWatch("9").settle({**clean, "exit_code": 137}, None) is None  # out of memory? Slurm says
    assert JobWatch("9").settle({**clean, "signal": "TERM", "exit_code": 143}, None) is None  # requeue? cancel?
    assert JobWatch("9").settle({**clean, "job_id": "8"}, None) is None  # an earlier job of the run
    assert JobWatch("9").settle(clean, info(JobState.RUNNING, restarts=1)) is None  # an earlier attempt
    assert JobWatch("9").settle({**clean, "exit_code": "x"}, None) is None  # garbled: not a clean end
    early = {**clean, "exit_code": 143, "signal": "early_stop"}
    assert JobWatch("9").settle(early, info(JobState.RUNNING)).outcome is Outcome.STOPPED_EARLY
    # A stale "running" from the last question does not hold the marker back.
    assert JobWatch("9").assess(info(JobState.RUNNING), clean, 0).outcome is Outcome.SUCCESS
    settled = marker_job_info(clean, "9", info(JobState.RUNNING, restarts=0, elapsed_s=3))
    assert (settled.state, settled.nodes, settled.elapsed_s) == (JobState.COMPLETED, "n[1-2]", 12)
    assert settled.source == "marker"


def test_an_array_between_questions_takes_only_clean_markers_and_counts_its_elements():
    watch = ArrayWatch("9", 4, WatchPolicy(), min_success_ratio=0.5)
    elements = [
        JobInfo("9_0", JobState.RUNNING),
        JobInfo("9_1", JobState.RUNNING),
        JobInfo("9_2", JobState.PENDING, reason="Resources"),
    ]
    assert watch.assess(elements, {}, 0) is None
    assert watch.counts() == {"pending": 2, "running": 2, "done": 0, "failed": 0}  # 9_3 not listed yet
    markers = {
        0: {"job_id": "9_0", "exit_code": 0, "restart": 0, "signal": ""},
        1: {"job_id": "9_1", "exit_code": 3, "restart": 0, "signal": ""},
    }
    assert watch.assess(None, markers, 1) is None
    assert set(watch.verdicts) == {0}  # element 1 failed by its marker: Slurm explains it at the next question
    assert watch.counts() == {"pending": 2, "running": 1, "done": 1, "failed": 0}


def test_progress_glosses_pending_reasons_and_says_only_changes():
    assert explain_reason("ReqNodeNotAvail, UnavailableNodes:node[1-2]").startswith(
        "ReqNodeNotAvail, UnavailableNodes:node[1-2]: the nodes it needs are down"
    )
    assert "capacity shortage" in explain_reason("ReqNodeNotAvail")
    assert explain_reason("QOSMaxJobsPerUserLimit").endswith("a quality-of-service limit holds it back")
    assert explain_reason("SomethingNew") == "SomethingNew"
    progress = JobProgress()
    pending = info(JobState.PENDING, reason="Priority")
    assert progress.note(pending) == "Slurm job 9 is pending: Priority: jobs of higher priority are queued ahead of it"
    assert progress.note(pending) is None
    assert "Resources" in progress.note(info(JobState.PENDING, reason="Resources"))
    booting = progress.note(info(JobState.RUNNING, "CONFIGURING", nodes="n1"))
    assert booting == "Slurm job 9 is starting: its nodes n1 are booting"
    assert progress.note(info(JobState.RUNNING, nodes="n1")) == "Slurm job 9 is running on n1"
    counts = ArrayProgress("9", 2)
    assert counts.note({"pending": 2, "running": 0, "done": 0, "failed": 0}) == (
        "Slurm job array 9 (2 elements): 2 pending, 0 running, 0 done, 0 failed"
    )
    assert counts.note({"pending": 2, "running": 0, "done": 0, "failed": 0}) is None
