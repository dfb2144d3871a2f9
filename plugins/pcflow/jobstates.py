"""Slurm job state, read from squeue, sacct or scontrol and normalised to one enum.

The three sources spell states differently (`CANCELLED by 0`, `CA`, `NODE_FAIL`) and know different
things (squeue: only live jobs; sacct: history, if accounting is on; scontrol: live jobs and jobs
finished within MinJobAge), so callers never see which one answered.

It sits in the foundation layer (it imports nothing of pcflow): the Slurm stage reads the states, and the
budget's cost meter and the harvest read what they say about a job without importing the Slurm stage.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum


class JobState(StrEnum):
    """Slurm's job states, reduced to what pcflow decides on; an unheard-of state is UNKNOWN, never an error."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    REQUEUED = "REQUEUED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    UNKNOWN = "UNKNOWN"

    @property
    def is_active(self) -> bool:
        """Still going, or will go again (Slurm keeps the job id across a requeue)."""
        return self in _ACTIVE

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL

    @property
    def is_interruption(self) -> bool:
        """Lost through no fault of the program: Slurm requeues such a job unless told not to."""
        return self in _INTERRUPTIONS


_ACTIVE = {JobState.PENDING, JobState.RUNNING, JobState.SUSPENDED, JobState.REQUEUED}
_INTERRUPTIONS = {JobState.NODE_FAIL, JobState.PREEMPTED, JobState.BOOT_FAIL}
_TERMINAL = {
    JobState.COMPLETED,
    JobState.FAILED,
    JobState.CANCELLED,
    JobState.TIMEOUT,
    JobState.OUT_OF_MEMORY,
    JobState.DEADLINE,
    *_INTERRUPTIONS,
}

# Every spelling Slurm 22.05-24.x prints, long and compact, mapped to the enum.
_ALIASES = {
    "PD": JobState.PENDING,
    "PENDING": JobState.PENDING,
    "R": JobState.RUNNING,
    "RUNNING": JobState.RUNNING,
    "CF": JobState.RUNNING,
    "CONFIGURING": JobState.RUNNING,
    "CG": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,
    "SO": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING,
    "SI": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "RS": JobState.RUNNING,
    "RESIZING": JobState.RUNNING,
    "S": JobState.SUSPENDED,
    "SUSPENDED": JobState.SUSPENDED,
    "ST": JobState.SUSPENDED,
    "STOPPED": JobState.SUSPENDED,
    "RQ": JobState.REQUEUED,
    "REQUEUED": JobState.REQUEUED,
    "RF": JobState.REQUEUED,
    "REQUEUE_FED": JobState.REQUEUED,
    "RH": JobState.REQUEUED,
    "REQUEUE_HOLD": JobState.REQUEUED,
    "SE": JobState.REQUEUED,
    "SPECIAL_EXIT": JobState.REQUEUED,
    "RD": JobState.PENDING,
    "RESV_DEL_HOLD": JobState.PENDING,
    "CD": JobState.COMPLETED,
    "COMPLETED": JobState.COMPLETED,
    "F": JobState.FAILED,
    "FAILED": JobState.FAILED,
    "CA": JobState.CANCELLED,
    "CANCELLED": JobState.CANCELLED,
    "RV": JobState.CANCELLED,
    "REVOKED": JobState.CANCELLED,
    "TO": JobState.TIMEOUT,
    "TIMEOUT": JobState.TIMEOUT,
    "OOM": JobState.OUT_OF_MEMORY,
    "OUT_OF_MEMORY": JobState.OUT_OF_MEMORY,
    "NF": JobState.NODE_FAIL,
    "NODE_FAIL": JobState.NODE_FAIL,
    "PR": JobState.PREEMPTED,
    "PREEMPTED": JobState.PREEMPTED,
    "BF": JobState.BOOT_FAIL,
    "BOOT_FAIL": JobState.BOOT_FAIL,
    "DL": JobState.DEADLINE,
    "DEADLINE": JobState.DEADLINE,
}


def normalise_state(raw: str) -> JobState:
    """`CANCELLED by 1000`, `cancelled+`, `CD` -> the enum; anything unheard of -> UNKNOWN."""
    word = raw.strip().split(" ")[0].rstrip("+").upper() if raw else ""
    return _ALIASES.get(word, JobState.UNKNOWN)


@dataclass(frozen=True)
class JobInfo:
    """What pcflow knows about one Slurm job at one moment."""

    job_id: str
    state: JobState
    raw_state: str = ""
    name: str = ""
    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""
    restarts: int = 0
    elapsed_s: int | None = None
    nodes: str = ""
    source: str = ""
    #: Who submitted it: on a shared cluster anyone may name a job after a run, so adoption checks this.
    user: str = ""

    def array_elements(self) -> list[JobInfo]:
        """sacct lists the elements of an array that never started as one record, `1234_[2-4,9%2]`:
        one JobInfo per element (any other job: itself)."""
        base, sep, spec = self.job_id.partition("_")
        if not (sep and spec.startswith("[") and spec.endswith("]")):
            return [self]
        return [replace(self, job_id=f"{base}_{i}") for i in parse_index_ranges(spec[1:-1])]

    @property
    def array_index(self) -> int | None:
        """The element's index when this is one element of a job array (`1234_7`)."""
        _, sep, index = self.job_id.partition("_")
        return int(index) if sep and index.isdigit() else None

    def as_dict(self) -> dict:
        """JSON for a trigger event or XCom (`from_dict` reads it back)."""
        return {**asdict(self), "state": str(self.state)}

    @classmethod
    def from_dict(cls, data: dict) -> JobInfo:
        """The JobInfo `as_dict` wrote."""
        return cls(**{**data, "state": JobState(data["state"])})


MAX_ARRAY_ELEMENTS = 100_000  # Slurm's own MaxArraySize is at most 4,000,001; pcflow's sweeps are far smaller


def parse_index_ranges(text: str) -> list[int]:
    """`2-4,9%2` -> [2, 3, 4, 9] (the `%` throttle is not an index); malformed parts are left out."""
    indices: list[int] = []
    for part in text.split("%", maxsplit=1)[0].split(","):
        low, _, high = part.partition("-")
        if low.isdigit() and (high.isdigit() or not high):
            stop = int(high or low)
            indices += range(int(low), min(stop, int(low) + MAX_ARRAY_ELEMENTS) + 1)
    return indices[:MAX_ARRAY_ELEMENTS]


def parse_exit_code(text: str) -> tuple[int | None, int | None]:
    """Slurm's `code:signal` (`0:0`, `1:0`, `0:9`) -> (code, signal)."""
    match = re.fullmatch(r"\s*(\d+):(\d+)\s*", text or "")
    if not match:
        return None, None
    return int(match.group(1)), int(match.group(2))


def parse_duration(text: str) -> int | None:
    """Slurm durations (`45`, `12:34`, `1:02:03`, `2-01:02:03`) -> seconds."""
    text = (text or "").strip()
    match = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(?:(\d+):)?(\d+)", text)
    if not match:
        return None
    days, a, b, c = match.groups()
    parts = [int(x) for x in (a, b) if x is not None] + [int(c)]
    while len(parts) < 3:
        parts.insert(0, 0)
    hours, minutes, seconds = parts
    return int(days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds


# JobArrayID is `<array id>_<index>` for array elements and the plain id otherwise.
SQUEUE_FIELDS = ("JobArrayID", "State", "Reason", "RestartCnt", "Name", "TimeUsed", "NodeList", "UserName")
SQUEUE_FORMAT = ",".join(f"{field}:|" for field in SQUEUE_FIELDS)
SACCT_FIELDS = ("JobID", "JobName", "State", "ExitCode", "ElapsedRaw", "NodeList", "Reason", "User")


def _fields(line: str, names: tuple[str, ...]) -> list[str] | None:
    """A line's `|`-separated fields, the last (the user) optional; None when fewer."""
    fields = line.split("|")
    if len(fields) < len(names) - 1:
        return None
    return [*fields, ""][: len(names)]


def parse_squeue(output: str) -> list[JobInfo]:
    """Lines of `squeue -h -O <SQUEUE_FORMAT>` (fields end in `|`)."""
    jobs = []
    for line in output.splitlines():
        fields = _fields(line, SQUEUE_FIELDS)
        if fields is None:
            continue
        job_id, raw, reason, restarts, name, used, nodes, user = (f.strip() for f in fields)
        jobs.append(
            JobInfo(
                job_id=job_id,
                state=normalise_state(raw),
                raw_state=raw,
                name=name,
                reason="" if reason in ("None", "(null)") else reason,
                restarts=int(restarts) if restarts.isdigit() else 0,
                elapsed_s=parse_duration(used),
                nodes="" if nodes == "(null)" else nodes,
                source="squeue",
                user=user,
            )
        )
    return jobs


def parse_sacct(output: str) -> list[JobInfo]:
    """Lines of `sacct -n -P -X -D -o <SACCT_FIELDS>`: one line per job, or per attempt with -D.

    With -D (duplicates) a requeued job appears once per attempt under the same id; the attempts are
    folded into one JobInfo whose `restarts` counts the earlier ones and whose state is the last.
    """
    by_id: dict[str, list[list[str]]] = {}
    for line in output.splitlines():
        fields = _fields(line, SACCT_FIELDS)
        if fields is not None and fields[0] and "." not in fields[0]:
            by_id.setdefault(fields[0], []).append(fields)
    jobs = []
    for job_id, attempts in by_id.items():
        _, name, raw, exit_text, elapsed, nodes, reason, user = attempts[-1]
        code, sig = parse_exit_code(exit_text)
        jobs.append(
            JobInfo(
                job_id=job_id,
                state=normalise_state(raw),
                raw_state=raw,
                name=name,
                exit_code=code,
                signal=sig,
                reason="" if reason in ("None", "(null)") else reason,
                restarts=len(attempts) - 1,
                elapsed_s=int(elapsed) if elapsed.isdigit() else None,
                nodes="" if nodes in ("None assigned", "(null)") else nodes,
                source="sacct",
                user=user.strip(),
            )
        )
    return jobs


def parse_scontrol(output: str) -> JobInfo | None:
    """`scontrol show job -o <id>`: one line of Key=Value pairs (values may contain spaces)."""
    line = output.strip().splitlines()[0] if output.strip() else ""
    pairs = dict(re.findall(r"(\w+(?::\w+)?)=(.*?)(?=\s+\w+(?::\w+)?=|$)", line))
    if "JobId" not in pairs:
        return None
    code, sig = parse_exit_code(pairs.get("ExitCode", ""))
    reason = pairs.get("Reason", "")
    return JobInfo(
        job_id=pairs["JobId"],
        state=normalise_state(pairs.get("JobState", "")),
        raw_state=pairs.get("JobState", ""),
        name=pairs.get("JobName", ""),
        exit_code=code,
        signal=sig,
        reason="" if reason == "None" else reason,
        restarts=int(pairs.get("Restarts", "0") or 0),
        elapsed_s=parse_duration(pairs.get("RunTime", "")),
        nodes="" if pairs.get("NodeList") in (None, "(null)") else pairs["NodeList"],
        source="scontrol",
        user=pairs.get("UserId", "").split("(")[0],
    )


# -- resource use of a job (the metrics stage) ------------------------------------------------------

# Without -X: the allocation line and one line per step (`<id>.batch`, `<id>.0`); MaxRSS is per step.
SACCT_USAGE_FIELDS = (
    "JobID",
    "State",
    "ExitCode",
    "ElapsedRaw",
    "NNodes",
    "NodeList",
    "AllocCPUS",
    "AllocTRES",
    "MaxRSS",
    "Start",
    "End",
)
_SIZE_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}


@dataclass(frozen=True)
class JobUsage:
    """What a job used, across all its attempts: for the report and the bill."""

    job_id: str
    state: JobState
    raw_state: str = ""
    exit_code: int | None = None
    signal: int | None = None
    elapsed_s: int | None = None
    #: node-seconds over every attempt (a requeued attempt was paid for too)
    node_seconds: int | None = None
    attempts: int = 1
    nodes: int | None = None
    node_list: str = ""
    alloc_cpus: int | None = None
    alloc_gpus: int = 0
    max_rss_bytes: int | None = None
    start: str = ""
    end: str = ""
    source: str = ""
    #: one entry per attempt, oldest first: the nodes it ran on, how it ended (a lost node: NODE_FAIL), when
    history: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        """JSON for the run's report and XCom."""
        return {**asdict(self), "state": str(self.state)}


def parse_size(text: str) -> int | None:
    """Slurm sizes (`1234K`, `2.5G`, `812M`, `0`) -> bytes; plain numbers are bytes as sacct prints them."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)([KMGTP]?)\s*", text or "")
    if not match:
        return None
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])


def parse_tres(text: str) -> dict[str, str]:
    """`cpu=8,mem=64G,node=1,billing=8,gres/gpu=8` -> {"cpu": "8", "mem": "64G", ..., "gres/gpu": "8"}."""
    return dict(item.split("=", 1) for item in (text or "").split(",") if "=" in item)


def tres_gpus(tres: dict[str, str]) -> int:
    """GPUs in a TRES map: `gres/gpu=8`, or typed ones (`gres/gpu:a100=8`) when untyped is absent."""
    if tres.get("gres/gpu", "").isdigit():
        return int(tres["gres/gpu"])
    return sum(int(v) for k, v in tres.items() if k.startswith("gres/gpu:") and v.isdigit())


def _timestamp(text: str) -> str:
    return "" if text in ("", "Unknown", "None", "(null)") else text


def parse_sacct_usage(output: str, job_id: str) -> JobUsage | None:
    """Lines of `sacct -n -P -D -j <id> -o <SACCT_USAGE_FIELDS>` (steps included)."""
    allocations: list[list[str]] = []
    max_rss: int | None = None
    for line in output.splitlines():
        fields = line.split("|")
        if len(fields) < len(SACCT_USAGE_FIELDS):
            continue
        if fields[0] == job_id:
            allocations.append(fields)
        elif fields[0].startswith(f"{job_id}."):
            rss = parse_size(fields[8])
            if rss is not None:
                max_rss = max(rss, max_rss or 0)
    if not allocations:
        return None
    last = allocations[-1][: len(SACCT_USAGE_FIELDS)]
    _, raw, exit_text, elapsed, nnodes, node_list, cpus, tres, _, start, end = last
    code, sig = parse_exit_code(exit_text)
    node_seconds = 0
    for attempt in allocations:
        if attempt[3].isdigit() and attempt[4].isdigit():
            node_seconds += int(attempt[3]) * int(attempt[4])
    history = [_attempt(number, fields) for number, fields in enumerate(allocations, start=1)]
    return JobUsage(
        job_id=job_id,
        state=normalise_state(raw),
        raw_state=raw,
        exit_code=code,
        signal=sig,
        elapsed_s=int(elapsed) if elapsed.isdigit() else None,
        node_seconds=node_seconds,
        attempts=len(allocations),
        nodes=int(nnodes) if nnodes.isdigit() else None,
        node_list="" if node_list in ("None assigned", "(null)") else node_list,
        alloc_cpus=int(cpus) if cpus.isdigit() else None,
        alloc_gpus=tres_gpus(parse_tres(tres)),
        max_rss_bytes=max_rss,
        start=_timestamp(start),
        end=_timestamp(end),
        source="sacct",
        history=history,
    )


def _attempt(number: int, fields: list[str]) -> dict:
    """One allocation line of `parse_sacct_usage`'s input: one attempt of the job."""
    _, raw, exit_text, elapsed, _, node_list, *_, start, end = fields[: len(SACCT_USAGE_FIELDS)]
    return {
        "attempt": number,
        "state": str(normalise_state(raw)),
        "raw_state": raw,
        "exit_code": parse_exit_code(exit_text)[0],
        "elapsed_s": int(elapsed) if elapsed.isdigit() else None,
        "node_list": "" if node_list in ("None assigned", "(null)") else node_list,
        "start": _timestamp(start),
        "end": _timestamp(end),
    }


def parse_scontrol_usage(output: str) -> JobUsage | None:
    """`scontrol show job -o <id>` when there is no accounting: no MaxRSS, and only the last attempt."""
    info = parse_scontrol(output)
    if info is None:
        return None
    line = output.strip().splitlines()[0]
    pairs = dict(re.findall(r"(\w+(?::\w+)?)=(.*?)(?=\s+\w+(?::\w+)?=|$)", line))
    tres = parse_tres(pairs.get("AllocTRES", pairs.get("TRES", "")))
    nodes = pairs.get("NumNodes", "").split("-")[0]
    return JobUsage(
        job_id=info.job_id,
        state=info.state,
        raw_state=info.raw_state,
        exit_code=info.exit_code,
        signal=info.signal,
        elapsed_s=info.elapsed_s,
        node_seconds=info.elapsed_s * int(nodes) if info.elapsed_s is not None and nodes.isdigit() else None,
        attempts=info.restarts + 1,
        nodes=int(nodes) if nodes.isdigit() else None,
        node_list=info.nodes,
        alloc_cpus=int(pairs["NumCPUs"]) if pairs.get("NumCPUs", "").isdigit() else None,
        alloc_gpus=tres_gpus(tres),
        start=_timestamp(pairs.get("StartTime", "")),
        end=_timestamp(pairs.get("EndTime", "")),
        source="scontrol",
    )
