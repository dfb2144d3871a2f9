"""When is a Slurm job done, and how did it end? The decisions, free of I/O, shared by every waiter.

A watcher sees three things: Slurm's view of the job (`JobInfo`, or None once Slurm has forgotten
it), the exit marker the batch script's wrapper writes, and the clock. Requeues are progress, not
failure: Slurm keeps the job id, bumps the restart count and runs the script again. What an end
means (its outcome, whether a retry may help, its message) is outcomes.END_STATES's to say.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace

from pcflow.jobstates import JobInfo, JobState
from pcflow.slurm.outcomes import (
    BUDGET_SIGNAL,
    END_STATES,
    ENDED_ON_PURPOSE,
    EndedBy,
    Outcome,
    describe_end,
    end_message,
)


@dataclass(frozen=True)
class WatchPolicy:
    """How a waiter paces itself.

    The marker and the log are checked every `poll_interval` over SFTP, which costs the head node a
    stat and nothing on slurmctld; slurmctld is asked every `confirm_interval`, and at once when a
    marker appears.
    """

    poll_interval: float = 1.0
    confirm_interval: float = 30.0
    pending_timeout: float | None = None
    max_restarts: int = 3
    interruption_grace: float = 120.0
    #: An array element neither Slurm (squeue, nor sacct with accounting) nor a marker knows of is given
    #: this long (a slow filesystem, a busy slurmctld) before it is judged lost.
    forgotten_grace: float = 300.0


@dataclass(frozen=True)
class Verdict:
    """The end of one job's wait: its outcome, the message for the task log, the exit code when one is known and
    whether a failure is worth a retry (outcomes.END_STATES decides; the waiter's own give-ups are)."""

    outcome: Outcome
    message: str
    exit_code: int | None = None
    retryable: bool = True


def marker_matches(marker: dict | None, info: JobInfo | None) -> bool:
    """The marker belongs to this job's current attempt (not a previous job or attempt)."""
    if not marker:
        return False
    if info is None:
        return True
    return str(marker.get("job_id")) == info.job_id and _int(marker.get("restart"), -1) >= info.restarts


def ends_cleanly(marker: dict | None, job_id: str, info: JobInfo | None) -> bool:
    """The marker settles the job without slurmctld: this job's current attempt ended by itself with exit
    code 0, or pcflow ended it on purpose (early stopping, the budget cap). Any other end (a signal, a
    non-zero code: out of memory, time limit, requeue, preemption) is Slurm's to explain."""
    if not marker or str(marker.get("job_id")) != job_id or not marker_matches(marker, info):
        return False
    signal = marker.get("signal") or ""
    return signal in ENDED_ON_PURPOSE or (signal == "" and _int(marker.get("exit_code"), -1) == 0)


def marker_job_info(marker: dict, job_id: str, last: JobInfo | None) -> JobInfo:
    """What the job's clean-ending marker says of it, over what Slurm said last (if it was asked)."""
    on_purpose = marker.get("signal") in ENDED_ON_PURPOSE
    state = JobState.CANCELLED if on_purpose else JobState.COMPLETED
    base = last or JobInfo(job_id=job_id, state=state)
    nodes, elapsed = marker.get("nodes"), marker.get("elapsed_s")
    return replace(
        base,
        state=state,
        raw_state=str(state),
        exit_code=_int(marker.get("exit_code"), 0),
        restarts=max(base.restarts, _int(marker.get("restart"), 0)),
        nodes=nodes if isinstance(nodes, str) and nodes else base.nodes,
        elapsed_s=elapsed if isinstance(elapsed, int) else base.elapsed_s,
        source="marker",
    )


#: slurmctld's description of a batch job whose launch failed: it requeued the job and held it (priority 0)
#: until someone runs `scontrol release` (squeue's Reason prints it as is, scontrol's with underscores).
LAUNCH_FAILED_HELD = "launch failed requeued held"


def held_after_failed_launch(info: JobInfo | None, job_id: str) -> bool:
    """Slurm holds this very job (`job_id`, the wait's own) after its launch failed. slurmctld does so when a
    node could not start the job, and after it was killed as the job started: recovering a state saved
    before the start, it found the job already on a node (node drained, "Duplicate jobid"). Nothing but a
    release ends that hold; the job's state and reason are in the squeue answer the wait already has."""
    if info is None or info.job_id != job_id or info.state not in (JobState.PENDING, JobState.REQUEUED):
        return False
    return " ".join(info.reason.replace("_", " ").split()).lower() == LAUNCH_FAILED_HELD


def _int(value: object, default: int) -> int:
    """A number from a marker (a file the job writes): anything else is the default, never an error."""
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        return default


@dataclass
class JobWatch:
    """Accumulates what a waiter has seen of one job and decides when it is over."""

    job_id: str
    policy: WatchPolicy = field(default_factory=WatchPolicy)
    pending_since: float | None = None
    interrupted_since: float | None = None
    #: Holds after a failed launch the waiter released (`release_due`), and the restart count the job had then.
    held_releases: int = 0
    released_at: int | None = None

    def restart_if_released(self, info: JobInfo) -> int:
        """Which restart a release of the held job would start, of the `max_restarts` budget: Slurm counts
        the launch failure's requeue in its restarts; the waiter's own count of releases covers a Slurm that
        would not."""
        return max(info.restarts, self.held_releases + 1)

    def release_due(self, info: JobInfo | None) -> bool:
        """The job is held after a failed launch, a release fits the budget, and it is not the hold a
        release was already sent for (an answer from before it) unless Slurm requeued the job since."""
        if not held_after_failed_launch(info, self.job_id) or self.released_already(info):
            return False
        return self.restart_if_released(info) <= self.policy.max_restarts

    def released_already(self, info: JobInfo) -> bool:
        """The hold `info` shows is the one a release was sent for (an answer from before the release took
        effect): not released again, nor counted against the budget again."""
        return self.released_at is not None and info.restarts == self.released_at

    def released(self, info: JobInfo) -> None:
        """The waiter released the hold `info` shows."""
        self.held_releases += 1
        self.released_at = info.restarts

    def assess(self, info: JobInfo | None, marker: dict | None, now: float) -> Verdict | None:
        """None while the job is (or will again be) running; a Verdict once it is over for good."""
        if info is None:
            return self._forgotten(marker)
        if not held_after_failed_launch(info, self.job_id):
            self.released_at = None  # the released hold is over: a new one may be released
        elif not self.released_already(info) and self.restart_if_released(info) > self.policy.max_restarts:
            return Verdict(
                Outcome.TOO_MANY_RESTARTS,
                f"Slurm job {info.job_id} is held after a failed launch ({LAUNCH_FAILED_HELD}); releasing it "
                f"would be restart {self.restart_if_released(info)}, more than max_restarts="
                f"{self.policy.max_restarts} ({self.held_releases} released already); pcflow cancels it. Look at "
                "the drained nodes (sinfo -R) and slurmctld's log.",
            )
        if info.restarts > self.policy.max_restarts:
            return Verdict(
                Outcome.TOO_MANY_RESTARTS,
                f"Slurm job {info.job_id} was requeued {info.restarts} times, more than max_restarts="
                f"{self.policy.max_restarts}; pcflow cancels it. Look for failing nodes or preemptions.",
            )
        if info.state.is_active and ends_cleanly(marker, self.job_id, info):
            return self._finished(info, _int(marker["exit_code"], 0), marker)
        if info.state in (JobState.PENDING, JobState.REQUEUED):
            return self._pending(info, now)
        self.pending_since = None
        if info.raw_state.upper() in ("COMPLETING", "CG") and marker_matches(marker, info):
            # The program is over and the marker has its exit code; Slurm is only running epilogs.
            return self._finished(info, _int(marker.get("exit_code"), 1), marker)
        if info.state.is_active:
            self.interrupted_since = None
            return None
        if info.state.is_interruption or self._requeue_in_flight(info, marker):
            return self._interrupted(info, now)
        exit_code = info.exit_code if info.exit_code is not None else (marker or {}).get("exit_code")
        return self._finished(info, exit_code, marker)

    def settle(self, marker: dict | None, last: JobInfo | None) -> Verdict | None:
        """Between two questions to slurmctld: a verdict when the marker alone settles the job (`last` is
        what Slurm said before, None when it was not asked yet)."""
        if (last is not None and not last.state.is_active) or not ends_cleanly(marker, self.job_id, last):
            return None
        return self._finished(last or JobInfo(self.job_id, JobState.RUNNING), _int(marker["exit_code"], 0), marker)

    @staticmethod
    def _requeue_in_flight(info: JobInfo, marker: dict | None) -> bool:
        """`scontrol requeue` ends the attempt with SIGTERM, and slurmctld can show FAILED for a moment
        before the job is pending again, its restart count already raised: a TERM marker of this attempt
        or of the one before it on a FAILED job gets the interruption grace."""
        if info.state is not JobState.FAILED or not marker or marker.get("signal") != "TERM":
            return False
        return str(marker.get("job_id")) == info.job_id and _int(marker.get("restart"), -1) >= info.restarts - 1

    def _pending(self, info: JobInfo, now: float) -> Verdict | None:
        self.interrupted_since = None
        if self.pending_since is None:
            self.pending_since = now
        limit = self.policy.pending_timeout
        if limit is not None and now - self.pending_since > limit:
            return Verdict(
                Outcome.PENDING_TIMEOUT,
                f"Slurm job {info.job_id} has been pending for more than {limit:.0f}s "
                f"(reason: {info.reason or 'none given'}); pcflow cancels it. Check the partition's capacity "
                "(sinfo), the instance quota, or raise pending_timeout.",
            )
        return None

    def _interrupted(self, info: JobInfo, now: float) -> Verdict | None:
        """NODE_FAIL/PREEMPTED are followed by a requeue within seconds unless requeue is off."""
        if self.interrupted_since is None:
            self.interrupted_since = now
        if now - self.interrupted_since < self.policy.interruption_grace:
            return None
        return self._finished(info, info.exit_code)

    def _finished(self, info: JobInfo, exit_code: int | None, marker: dict | None = None) -> Verdict:
        """The job is over: outcomes.END_STATES says what that means, pcflow's own stop (the marker) first."""
        signal = ((marker or {}).get("signal") or "") if marker_matches(marker, info) else ""
        end = describe_end(info, exit_code, signal)
        code = exit_code if exit_code is not None else (0 if end.outcome is Outcome.SUCCESS else None)
        return Verdict(end.outcome, end.message, code, end.rule.retryable)

    @staticmethod
    def _on_purpose(job_id: str, signal: str, exit_code: int | None) -> Verdict:
        by = EndedBy.BUDGET if signal == BUDGET_SIGNAL else EndedBy.EARLY_STOP
        rule = END_STATES[None, by]
        return Verdict(rule.outcome, end_message(job_id, rule), exit_code)

    def _forgotten(self, marker: dict | None) -> Verdict:
        """Without accounting, slurmctld forgets a finished job after MinJobAge: the marker decides."""
        if marker and str(marker.get("job_id")) == self.job_id:
            code = _int(marker.get("exit_code"), 1)
            if marker.get("signal") in ENDED_ON_PURPOSE:
                return self._on_purpose(self.job_id, marker["signal"], code)
            state = JobState.COMPLETED if code == 0 else JobState.FAILED
            info = JobInfo(self.job_id, state, raw_state=f"{state}, from its exit marker")
            end = describe_end(info, code)
            return Verdict(end.outcome, end.message, code, end.rule.retryable)
        return Verdict(
            Outcome.LOST,
            f"Slurm no longer knows job {self.job_id} and it left no exit marker: it was probably purged "
            "before it could start, or the shared filesystem is not shared with the compute nodes.",
        )


@dataclass(frozen=True)
class ArrayVerdict:
    """The end of an array's wait: the array's outcome and message, and one record per element for the result
    (an array's failure stays retryable, as it always was: which elements failed how is in `elements`)."""

    outcome: Outcome
    message: str
    elements: list[dict]
    retryable: bool = True


class ArrayWatch:
    """A JobWatch per element; the array is over when every element is, and it succeeds when at least
    `min_success_ratio` of them did (a sweep may tolerate a diverging trial)."""

    def __init__(self, array_id: str, size: int, policy: WatchPolicy, min_success_ratio: float = 1.0) -> None:
        self.array_id = array_id
        self.size = size
        self.min_success_ratio = min_success_ratio
        self.policy = policy
        self.watches = {i: JobWatch(f"{array_id}_{i}", policy) for i in range(size)}
        self.verdicts: dict[int, Verdict] = {}
        self.unseen_since: dict[int, float] = {}
        self.latest: dict[int, JobInfo] = {}  # each element as Slurm last described it

    def assess(
        self, elements: list[JobInfo] | None, markers: dict[int, dict | None], now: float
    ) -> ArrayVerdict | None:
        """`elements`: Slurm's fresh answer, or None between two questions, when only markers that settle
        an element by themselves decide."""
        if elements is not None:
            self.latest = {e.array_index: e for e in elements if e.array_index is not None}
        for index, watch in self.watches.items():
            if index in self.verdicts:
                continue
            verdict = self._assess_element(index, watch, markers.get(index), elements is not None, now)
            if verdict is not None and verdict.outcome.needs_cancel:
                return ArrayVerdict(verdict.outcome, verdict.message, self._elements())
            if verdict is not None:
                self.verdicts[index] = verdict
        if len(self.verdicts) < self.size:
            return None
        succeeded = sum(v.outcome.ok for v in self.verdicts.values())
        needed = math.ceil(self.min_success_ratio * self.size)
        summary = f"{succeeded} of {self.size} elements of Slurm job array {self.array_id} succeeded"
        if succeeded >= needed:
            return ArrayVerdict(Outcome.SUCCESS, summary, self._elements())
        failed = "; ".join(v.message for v in self.verdicts.values() if not v.outcome.ok)
        return ArrayVerdict(Outcome.FAILED, f"{summary}, {needed} needed: {failed}", self._elements())

    def _assess_element(
        self, index: int, watch: JobWatch, marker: dict | None, fresh: bool, now: float
    ) -> Verdict | None:
        info = self.latest.get(index)
        if not fresh:
            return watch.settle(marker, info)
        if info is None and not marker and not self._forgotten_for_good(index, now):
            return None
        self.unseen_since.pop(index, None)
        return watch.assess(info, marker, now)

    def counts(self) -> dict[str, int]:
        """Elements pending (or about to be requeued), running, done (succeeded or stopped early) and failed."""
        counts = dict.fromkeys(("pending", "running", "done", "failed"), 0)
        for index in range(self.size):
            verdict, info = self.verdicts.get(index), self.latest.get(index)
            if verdict is not None:
                counts["done" if verdict.outcome.ok else "failed"] += 1
            elif info is None or info.state in (JobState.PENDING, JobState.REQUEUED) or info.state.is_interruption:
                counts["pending"] += 1
            elif info.state.is_active:
                counts["running"] += 1
            else:
                counts["done" if info.state is JobState.COMPLETED else "failed"] += 1
        return counts

    def _forgotten_for_good(self, index: int, now: float) -> bool:
        """squeue lists every element (pending ones too), so one it lacks has ended and been purged
        (MinJobAge); without a marker or accounting nothing else will ever speak for it."""
        since = self.unseen_since.setdefault(index, now)
        return now - since >= self.policy.forgotten_grace

    def _elements(self) -> list[dict]:
        return [
            {"index": i, "outcome": str(v.outcome), "exit_code": v.exit_code, "message": v.message}
            for i, v in sorted(self.verdicts.items())
        ]


#: Values shorter than this are not hidden (as Airflow's own masker): "1" or "INFO" would blank half a log.
MIN_HIDDEN_LENGTH = 5


def hide(text: str, values: tuple[str, ...]) -> str:
    """`text` with each of `values` (longest first, so none hides part of another) replaced by `***`."""
    for value in sorted(values, key=len, reverse=True):
        if len(value) >= MIN_HIDDEN_LENGTH:
            text = text.replace(value, "***")
    return text


#: The longest log line kept: a job printing without newlines (progress bars, a runaway print) gets
#: its line cut here, the rest counted, so memory stays bounded whatever the job writes.
MAX_LINE_BYTES = 16 * 1024


@dataclass
class LogCursor:
    """Turns appended byte chunks into whole lines, each delivered once and in order; a line longer
    than `max_line` keeps its start and says how many bytes were cut."""

    offset: int = 0
    tail_size: int = 30
    max_line: int = MAX_LINE_BYTES
    #: Values no line may show (the job's secrets): replaced by `***` in every line delivered.
    hidden: tuple[str, ...] = ()
    _partial: bytearray = field(default_factory=bytearray)
    _cut: int = 0
    tail: deque = field(default_factory=deque)

    def __post_init__(self) -> None:
        self.tail = deque(self.tail, maxlen=self.tail_size)

    def feed(self, chunk: bytes, max_lines: int | None = None) -> list[str]:
        """The lines `chunk` completes, at most `max_lines` of them: `offset` then advances only past
        what was taken, and the caller reads the rest again from there."""
        lines: list[str] = []
        start = 0
        while max_lines is None or len(lines) < max_lines:
            end = chunk.find(b"\n", start)
            if end < 0:
                self._keep(chunk, start, len(chunk))
                start = len(chunk)
                break
            self._keep(chunk, start, end)
            lines.append(self._take_line())
            start = end + 1
        self.offset += start
        self.tail.extend(lines)
        return lines

    def skip_to(self, offset: int) -> int:
        """Jump ahead (a log growing faster than it can be followed); the line in progress is dropped.
        Returns the bytes skipped."""
        skipped = max(0, offset - self.offset)
        self.offset += skipped
        self._partial.clear()
        self._cut = 0
        return skipped

    def flush(self) -> list[str]:
        """The last line, when the file ended without a newline."""
        if not self._partial and not self._cut:
            return []
        line = self._take_line()
        self.tail.append(line)
        return [line]

    def _keep(self, chunk: bytes, start: int, end: int) -> None:
        room = max(0, self.max_line - len(self._partial))
        self._partial += chunk[start : min(end, start + room)]
        self._cut += max(0, end - start - room)

    def _take_line(self) -> str:
        line = hide(self._partial.decode(errors="replace"), self.hidden)
        if self._cut:
            line += f" [... {self._cut} more bytes of this line not shown]"
        self._partial.clear()
        self._cut = 0
        return line
