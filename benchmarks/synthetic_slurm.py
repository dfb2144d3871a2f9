"""A Slurm that answers from a job table, reached over the real sshd: the trigger path at a scale this
machine's slurmctld cannot hold (1,000 jobs on 2 shared cores make it fail launches and stall).

`install(directory)` writes `squeue`, `sacct` and `scontrol` there: small sh wrappers that run this file
with the system Python (no venv, no pyenv: a command must cost what a real client costs, not a login
shell's interpreter hunt). A trigger whose `slurm_bin` names that directory runs them over its SSH
connection exactly as it runs the real ones; they answer in real Slurm's formats (`squeue -O` with `|`
suffixes, `sacct -P`, `scontrol show job -o`), from `jobs.tsv` in the same directory, and append one
line per call to `queries.log`, so the benchmark counts what the waits asked of "slurmctld" (squeue,
scontrol) and of "slurmdbd" (sacct).

`JobTable` is the benchmark's side: it submits jobs, runs them on a schedule and ends them, writing what
pcflow's batch wrapper writes (the job log's lines, then `exit.json` through a temporary file and a
rename) and the SSH provider's exit-code file, then flips the job's state in the table.
"""

from __future__ import annotations

import heapq
import json
import math
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

COMMANDS = ("squeue", "sacct", "scontrol")
TABLE, QUERY_LOG = "jobs.tsv", "queries.log"
COLUMNS = ("job_id", "state", "exit_code", "name", "start", "end", "node", "restarts")
INVALID = "slurm_load_jobs error: Invalid job id specified"
#: A job ended this long ago is forgotten by squeue (slurmctld's MinJobAge); sacct keeps it.
MIN_JOB_AGE_S = 300


# -- the head node's side: the commands ---------------------------------------------------------


def _read_table(directory: Path) -> dict[str, dict[str, str]]:
    jobs = {}
    with open(directory / TABLE) as fh:
        for line in fh:
            row = dict(zip(COLUMNS, line.rstrip("\n").split("\t"), strict=False))
            jobs[row["job_id"]] = row
    return jobs


def _ids(argv: list[str]) -> list[str]:
    """The ids of `-j a,b,c` (squeue, sacct) or the last word (`scontrol show job -o <id>`)."""
    if "-j" in argv:
        return argv[argv.index("-j") + 1].split(",")
    return [argv[-1]]


def _used(row: dict[str, str], now: float) -> int:
    if row["state"] == "PENDING" or not row["start"]:
        return 0
    end = float(row["end"]) if row["state"] not in ("RUNNING",) and row["end"] else now
    return max(0, int(end - float(row["start"])))


def _clock(seconds: int) -> str:
    """squeue's TimeUsed: M:SS, H:MM:SS past an hour."""
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def _exit(row: dict[str, str]) -> str:
    """ExitCode `<code>:<signal>`: the job's own only once it ended."""
    return f"{row['exit_code'] or 0}:0" if row["state"] in ("COMPLETED", "FAILED") else "0:0"


def _reason(row: dict[str, str]) -> str:
    return "Priority" if row["state"] == "PENDING" else "None"


def squeue(rows: list[dict[str, str]], now: float) -> str:
    """`squeue -h -r -t all -j <ids> -O JobArrayID:|,State:|,...` (states.SQUEUE_FIELDS)."""
    live = [r for r in rows if r["state"] in ("PENDING", "RUNNING") or now - float(r["end"] or now) < MIN_JOB_AGE_S]
    return "".join(
        f"{r['job_id']}|{r['state']}|{_reason(r)}|{r['restarts']}|{r['name']}|{_clock(_used(r, now))}|"
        f"{r['node'] if r['state'] != 'PENDING' else ''}|root|\n"
        for r in live
    )


def sacct(rows: list[dict[str, str]], now: float) -> str:
    """`sacct -n -P -X -D -j <ids> -o JobID,JobName,State,ExitCode,ElapsedRaw,NodeList,Reason,User`."""
    return "".join(
        f"{r['job_id']}|{r['name']}|{r['state']}|{_exit(r)}|{_used(r, now)}|"
        f"{r['node'] if r['state'] != 'PENDING' else 'None assigned'}|{_reason(r)}|root\n"
        for r in rows
    )


def scontrol(rows: list[dict[str, str]], now: float) -> str:
    """`scontrol show job -o <id>`: one line of Key=Value pairs."""
    return "".join(
        f"JobId={r['job_id']} JobName={r['name']} UserId=root(0) GroupId=root(0) JobState={r['state']} "
        f"Reason={_reason(r)} Dependency=(null) Restarts={r['restarts']} ExitCode={_exit(r)} "
        f"RunTime={_clock(_used(r, now))} NodeList={r['node'] or '(null)'}\n"
        for r in rows
    )


def answer(directory: Path, command: str, argv: list[str]) -> int:
    """Answer one command as Slurm would, and log the call."""
    now = time.time()
    with open(directory / QUERY_LOG, "a") as log:
        log.write(f"{now:.3f} {command} {len(_ids(argv))}\n")
    if command == "scontrol" and argv[:2] != ["show", "job"]:
        print(f"scontrol: the synthetic Slurm answers only `show job`, not {argv[:2]}", file=sys.stderr)
        return 1
    table = _read_table(directory)
    rows = [table[i] for i in _ids(argv) if i in table]
    if not rows and command != "sacct":
        print(INVALID, file=sys.stderr)
        return 1
    sys.stdout.write({"squeue": squeue, "sacct": sacct, "scontrol": scontrol}[command](rows, now))
    return 0


# -- the benchmark's side -------------------------------------------------------------------------


def install(directory: Path) -> Path:
    """Write the three commands into `directory` (an empty job table and query log): a trigger's
    `slurm_bin`."""
    directory.mkdir(parents=True, exist_ok=True)
    interpreter = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
    runs = shlex.join([interpreter, "-I", "-S", str(Path(__file__).resolve()), str(directory)])
    for command in COMMANDS:
        wrapper = directory / command
        wrapper.write_text(f'#!/bin/sh\nexec {runs} {command} "$@"\n')
        wrapper.chmod(0o755)
    (directory / TABLE).write_text("")
    (directory / QUERY_LOG).write_text("")
    return directory


def queries(directory: Path, since: float = 0.0) -> dict[str, int]:
    """Calls of each command since `since` (epoch s), from the query log."""
    counts = dict.fromkeys(COMMANDS, 0)
    for line in (directory / QUERY_LOG).read_text().splitlines():
        stamp, command, _ = line.split()
        if float(stamp) >= since:
            counts[command] += 1
    return counts


@dataclass
class Job:
    """One synthetic job: runs from `start` to `end` (epoch s) in `run_dir`, ends with `exit_code`."""

    job_id: str
    run_dir: str
    name: str
    start: float
    end: float
    exit_code: int = 0
    state: str = "PENDING"
    written: bool = field(default=False, repr=False)


class JobTable:
    """The jobs the synthetic Slurm knows, moved along by `advance()` as the clock passes their times (a heap
    of what is due next: a soak's thousands of jobs cost a tick only what changes in it)."""

    def __init__(self, directory: Path, forget_after: float = 600.0) -> None:
        self.directory = directory
        self.forget_after = forget_after
        self.jobs: dict[str, Job] = {}
        self._due: list[tuple[float, int, str]] = []  # (when, what: 0 start 1 end 2 forget, job id)

    def submit(self, job: Job) -> None:
        """A new pending job (its run directory made, its log started); `schedule` when its times are known."""
        Path(job.run_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
        Path(job.run_dir, "job.log").write_text(f"job {job.job_id} queued\n")
        self.jobs[job.job_id] = job
        self.schedule(job)

    def schedule(self, job: Job) -> None:
        """Queue the job's start and end at its (finite) times."""
        if math.isfinite(job.start) and math.isfinite(job.end):
            heapq.heappush(self._due, (job.start, 0, job.job_id))
            heapq.heappush(self._due, (job.end, 1, job.job_id))

    def advance(self, now: float) -> list[Job]:
        """Start the jobs whose start came, end those whose end came (files first, then the table, as the
        batch wrapper ends before slurmctld hears of it); forget jobs long over. The jobs that ended."""
        ended, changed = [], False
        while self._due and self._due[0][0] <= now:
            _, what, job_id = heapq.heappop(self._due)
            job, changed = self.jobs[job_id], True
            if what == 0:
                job.state = "RUNNING"
                with open(Path(job.run_dir, "job.log"), "a") as log:
                    log.write(f"job {job.job_id} running on node1\n")
            elif what == 1:
                self._write_end(job)
                job.state = "COMPLETED" if job.exit_code == 0 else "FAILED"
                ended.append(job)
                heapq.heappush(self._due, (job.end + self.forget_after, 2, job_id))
            else:
                del self.jobs[job_id]
        if changed:
            self.save()
        return ended

    def _write_end(self, job: Job) -> None:
        """What the job and pcflow's wrapper write at its end: the stamp, the peer's exit-code file, the
        log's last line, the marker (through a temporary file and a rename)."""
        root = Path(job.run_dir)
        (root / "end").write_text(f"{time.time():.6f}\n")
        (root / "peer_exit").write_text(f"{job.exit_code}\n")
        with open(root / "job.log", "a") as log:
            log.write(f"job {job.job_id} exits {job.exit_code}\n")
        marker = {
            "job_id": job.job_id,
            "exit_code": job.exit_code,
            "restart": 0,
            "signal": "",
            "nodes": "node1",
            "elapsed_s": int(job.end - job.start),
            "outputs": {"model.pt": -1, "metrics.jsonl": -1},
        }
        (root / "exit.json.tmp").write_text(json.dumps(marker) + "\n")
        os.replace(root / "exit.json.tmp", root / "exit.json")

    def save(self) -> None:
        """The table the commands read, replaced whole (a reader never sees half of it)."""
        lines = (
            "\t".join((j.job_id, j.state, str(j.exit_code), j.name, f"{j.start:.3f}", f"{j.end:.3f}", "node1", "0"))
            + "\n"
            for j in self.jobs.values()
        )
        tmp = self.directory / f"{TABLE}.tmp"
        tmp.write_text("".join(lines))
        os.replace(tmp, self.directory / TABLE)


if __name__ == "__main__":
    sys.exit(answer(Path(sys.argv[1]), sys.argv[2], sys.argv[3:]))
