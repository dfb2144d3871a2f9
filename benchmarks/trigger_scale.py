"""Many concurrent waits on one head node: what they cost sshd, slurmctld and the triggerer, and how soon
they notice each job's end. pcflow's triggers (one shared session per head node) against the SSH
provider's SSHRemoteJobTrigger (apache-airflow-providers-ssh, defaults: a connection and a poll loop
per wait), measured in the same run on the local stack.

Each phase submits N short `sleep` jobs (20 to 39 s with the default --job-seconds), each through
pcflow's own batch wrapper (srun launcher), held, to the local Slurm's default partition,
oversubscribed for the run so that about --running-at-once jobs (default 200) run side by side
(`OverSubscribe=FORCE:<k>`, k from the partition's CPUs; set back afterwards, the stack's configuration
is not touched). A child process then plays the triggerer: every trigger's run() on one event loop,
each in its own task with its log context bound, as Airflow's triggerer runs them. Once they all wait,
the jobs are released. Per phase: SSH connections sshd authenticated (its log) and the most open at
once (ss), slurmctld RPCs by type (sdiag, reset after submission), the waiting process's CPU seconds
over the wait and peak RSS, its longest event-loop stall, latency (each job's program stamps
time.time() as its last act; the trigger's event ends the wait) split at the file each side watches
(pcflow's marker, the peer's exit-code file), and each verdict checked against Slurm's accounting
(jobs lost: Slurm ended the job, the wait said nothing or something else). The peer's exit-code file
is written right after the stamp, before pcflow's wrapper writes its marker, which favours the peer.

The shape, and why. All N waits run at once in the one triggerer for the whole phase, on jobs that
are queued or running, as a team's sweep on one cluster is: the cluster runs what its capacity allows
and queues the rest, and jobs end spread over the wait. An earlier shape let 768 of the 1000 jobs run
at once (FORCE:64) on three slurmd sharing this machine's 2 cores with sshd, slurmctld, slurmdbd and the
waiting process: its launch and end storms made Slurm fail 61 jobs and lose 82 launches (requeued
held), and the head node answered a stat in up to 6.4 s, so it measured the emulator rather than the
wait. Capping the jobs that run at once keeps every wait concurrent and the head node honest; the
slurmctld query count and the triggerer's CPU still cover all N waits. The detection goal is read
from the marker's mtime (`detection_s`: the wrapper wrote it, the event came), which is pcflow's part;
`latency_s` (from the program's last act) adds the batch wrapper's own end under load and is reported
beside it. One job in FAIL_EVERY exits 3, as a sweep's diverging trials do: the wait must report it
failed, with Slurm's word, without asking slurmctld more often (pcflow asks slurmdbd: sacct).

With --slurm synthetic the waits run against benchmarks/synthetic_slurm.py instead of slurmctld: the same
triggers, the same sshd and SSH channel, their `slurm_bin` pointing at squeue/sacct/scontrol that answer in
Slurm's formats from a job table the harness drives (each job's end written as pcflow's wrapper writes it).
On this 2-core machine slurmctld fails launches at 1,000 jobs; the synthetic table does not, so N=1000 measures
the trigger path alone (results in trigger_scale_synthetic.json). Failing jobs and the peer as above.

Usage: .venv/bin/python benchmarks/trigger_scale.py [--sizes 50,200,1000] [--peer-sizes 50,200]
           [--job-seconds 20] [--slurm stack|synthetic] [--spread-seconds 60] [--out FILE]
Needs the local stack (started when down); prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import itertools
import json
import math
import os
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "plugins"), str(REPO / "tests")]
os.environ.setdefault("AIRFLOW_HOME", str(REPO / ".stack" / "airflow"))

RESULTS = REPO / "benchmarks" / "results" / "trigger_scale.json"
RESULTS_SYNTHETIC = REPO / "benchmarks" / "results" / "trigger_scale_synthetic.json"
SYNTHETIC_NOTE = (
    "synthetic: squeue, sacct and scontrol answer from a job table (benchmarks/synthetic_slurm.py) over the stack's "
    "real sshd (the waits' slurm_bin); the harness writes each job's log, marker and exit-code file at its end. "
    "slurmctld_job_queries counts squeue and scontrol calls, slurmdbd_job_queries sacct calls."
)
GOAL = (
    "pcflow at N=1000: <= 1 SSH connection per head node per triggerer, <= 1 slurmctld job query per cluster "
    "per 30 s, detection median <= 1 s and p99 <= 3 s, triggerer CPU <= 20% of one core over the wait, 0 jobs lost"
)
#: Every FAIL_EVERY-th job exits 3, as a sweep's diverging trials do: a marker that cannot settle its job,
#: so Slurm must say why, and the wait must say failed.
FAIL_EVERY = 20
NOTES = [
    "One machine plays every part (2 cores, shared with other work: see load_avg_1m_start_end per phase).",
    "Every SSH command starts the login shell, and root's ~/.bashrc here runs pyenv init: about 0.5 s and a "
    "dozen processes per command. The peer runs 2-3 commands per wait per poll; pcflow's session one "
    "long-lived stat loop per connection and one squeue per 30 s.",
    "latency_s: from the job program's last act to the trigger's event. The peer's exit-code file is written "
    "right after it; pcflow's marker after srun and the batch wrapper end (0.1-0.5 s later here).",
    "detection_s: from the end file's mtime (pcflow's marker, the peer's exit-code file) to the event; the goal "
    "is read from it. end_file_delay_s is the job's own part (the batch wrapper's end on a loaded machine).",
    "slurmdbd_job_queries: sacct's questions (slurmdbd, not slurmctld): pcflow asks accounting about a job "
    "whose marker cannot settle it by itself (a non-zero exit, a signal) instead of bringing the squeue forward.",
    "Jobs past running_at_once queue in Slurm (pending) while their waits run: all N waits are concurrent.",
    f"One job in {FAIL_EVERY} exits 3 (jobs_failed_on_purpose): the wait must say failed, Slurm saying why; "
    "failure_detection_s is from its marker to the event.",
]
PEER_CLASS = "airflow.providers.ssh.triggers.ssh_remote_job.SSHRemoteJobTrigger"
PEER_NAME = "SSHRemoteJobTrigger (apache-airflow-providers-ssh 7.0.1, defaults: poll every 5 s)"
#: Jobs the oversubscribed partition runs side by side (the rest queue): OverSubscribe=FORCE:<k> per core.
RUNNING_AT_ONCE = 200
#: Before the jobs are released: every trigger has started and made its connection (the peer's 200 take a while).
STARTUP_S = 10.0
JOB_QUERIES = ("REQUEST_JOB_INFO", "REQUEST_JOB_INFO_SINGLE", "REQUEST_JOB_USER_INFO")
#: The job: sleep, stamp its end, write the peer's exit-code file, exit. $1: seconds, $2: exit code.
PROGRAM = 'sleep "$1"; date +%s.%N > "$PCFLOW_RUN_DIR/end"; echo "$2" > "$PCFLOW_RUN_DIR/peer_exit"; exit "$2"'


# -- the harness side: Slurm, sshd, the phases --------------------------------------------------------


def slurm(*argv: str, timeout: float = 600) -> str:
    """A Slurm command on the head node (this machine), as its administrator runs it."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)[:200]} failed: {proc.stderr.strip()[-500:]}")
    return proc.stdout


def default_partition() -> tuple[str, str, int]:
    """The default partition's name, its OverSubscribe setting and its CPUs."""
    for line in slurm("scontrol", "show", "partition", "-o").splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if fields.get("Default") == "YES":
            return fields["PartitionName"], fields.get("OverSubscribe", "NO"), int(fields["TotalCPUs"])
    raise RuntimeError("the local Slurm has no default partition")


def rpc_counts(*stats: str) -> dict[str, int]:
    """RPC counts by message type since the last reset: slurmctld's (sdiag) or slurmdbd's (sacctmgr show stats)."""
    out, counts, inside = slurm(*stats), {}, False
    for line in out.splitlines():
        if line.startswith("Remote Procedure Call statistics by message type"):
            inside = True
        elif inside and not line.strip():
            break
        elif inside and (match := re.match(r"\s*(\w+)\s*\(\s*\d+\)\s*count:(\d+)", line)):
            counts[match.group(1)] = int(match.group(2))
    return counts


class SshdWatch:
    """Counts at sshd: connections it authenticated and dropped (its log), the most open at once (ss)."""

    def __init__(self, state_dir: Path, port: int) -> None:
        self.log, self.port = state_dir / "logs" / "sshd.log", port
        self.peak_open = 0
        self._stop = threading.Event()

    def _log_counts(self) -> tuple[int, int]:
        text = self.log.read_text(errors="replace")
        return text.count("Accepted publickey"), text.count("past MaxStartups")

    def _open_now(self) -> int:
        out = subprocess.run(
            ["ss", "-Htn", "state", "established", f"( sport = :{self.port} )"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        return len(out.splitlines())

    def __enter__(self) -> SshdWatch:
        self.start_counts = self._log_counts()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.5):
            self.peak_open = max(self.peak_open, self._open_now())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._sampler.join()
        accepted, dropped = self._log_counts()
        self.accepted, self.dropped = accepted - self.start_counts[0], dropped - self.start_counts[1]


def prepare_jobs(shared: Path, label: str, count: int, seconds: float) -> list[dict]:
    """`count` held jobs, each a pcflow run directory with its rendered batch script; their trigger kwargs.
    Job i sleeps `seconds + i % seconds`: ends (and the next jobs' starts) spread as real jobs' do,
    instead of a few hundred launches at the same instant on the two cores that also run everything else;
    one in FAIL_EVERY exits 3."""
    from pcflow.slurm.operators import SlurmJobOperator
    from pcflow.slurm.render import render_batch_script, render_hparams
    from pcflow.slurm.spec import RunDir

    run_key = f"bench-{label}-{uuid.uuid4().hex[:8]}"
    jobs = []
    for i in range(count):
        sleep = seconds + i % max(int(seconds), 1)
        code = 3 if i % FAIL_EVERY == FAIL_EVERY - 1 else 0
        op = SlurmJobOperator(task_id=f"t{i}", program=["bash", "-c", PROGRAM, "bash", str(sleep), str(code)])
        run_dir = RunDir.for_job(str(shared), run_key, f"t{i}")
        Path(run_dir.root).mkdir(mode=0o700, parents=True)
        spec = op.job_spec()
        Path(run_dir.hparams).write_text(render_hparams(spec))
        script = Path(run_dir.script)
        script.write_text(render_batch_script(spec, run_dir, job_name=f"{run_key}.t{i}", run_key=run_key))
        script.chmod(0o700)
        jobs.append({"op": op, "run_dir": run_dir, "meant_to_fail": code != 0})
    return jobs


def submit_held(jobs: list[dict]) -> list[str]:
    """sbatch --hold for each, in one shell loop (the scripts travel as positional parameters)."""
    loop = 'for s; do sbatch --parsable --hold "$s"; done'
    ids = slurm("sh", "-c", loop, "sh", *[j["run_dir"].script for j in jobs]).split()
    ids = [i.split(";")[0] for i in ids]
    if len(ids) != len(jobs) or not all(i.isdigit() for i in ids):
        raise RuntimeError(f"submitted {len(ids)} of {len(jobs)} jobs: {ids[:5]}...")
    return ids


def pcflow_triggers(jobs: list[dict], ids: list[str]) -> list[list]:
    from pcflow.slurm.hook import SlurmHook

    hook = SlurmHook()  # what the operator hands its trigger: accounting, slurm_bin, the pinned host key
    try:
        triggers = []
        for job, job_id in zip(jobs, ids, strict=True):
            op = job["op"]
            op.hook, op.job_id = hook, job_id
            triggers.append(list(op.make_trigger(job["run_dir"], 0).serialize()))
        return triggers
    finally:
        hook.close()


def peer_triggers(jobs: list[dict], ids: list[str]) -> list[list]:
    triggers = []
    for job, job_id in zip(jobs, ids, strict=True):
        root = job["run_dir"].root
        files = {"log_file": f"{root}/job.log", "exit_code_file": f"{root}/peer_exit"}
        kwargs = {
            "ssh_conn_id": "slurm_default",
            "remote_host": None,
            "job_id": job_id,
            "job_dir": root,
            "remote_os": "posix",
            **files,
        }
        triggers.append([PEER_CLASS, kwargs])
    return triggers


def run_phase(stack: dict, side: str, count: int, seconds: float) -> dict:
    """One side waiting for `count` jobs; `stack`: its state dir, sshd port and shared root."""
    stack_dir, shared = stack["dir"], stack["shared"]
    label = f"{side}-{count}"
    jobs = prepare_jobs(shared, label, count, seconds)
    ids = submit_held(jobs)
    triggers = pcflow_triggers(jobs, ids) if side == "pcflow" else peer_triggers(jobs, ids)
    work = stack_dir / "bench" / label
    shutil.rmtree(work, ignore_errors=True)  # an earlier run's `ready` would release the jobs at once
    work.mkdir(parents=True)
    roots = [j["run_dir"].root for j in jobs]
    evidence = "exit.json" if side == "pcflow" else "peer_exit"  # what each side watches for the end
    spec = {
        "triggers": triggers,
        "stamps": [f"{root}/end" for root in roots],
        "ends": [f"{root}/{evidence}" for root in roots],
        "deadline_s": deadline_s(side, count, seconds),
        "diagnose_ticks": side == "pcflow",
    }
    (work / "spec.json").write_text(json.dumps(spec))
    slurm("sdiag", "--reset")
    slurm("sacctmgr", "-i", "clear", "stats")
    load_start, reset_at = os.getloadavg(), time.monotonic()
    with SshdWatch(stack_dir, stack["sshd_port"]) as sshd, open(work / "triggerer.log", "wb") as log:
        child = subprocess.Popen([sys.executable, __file__, "--wait", str(work)], stdout=log, stderr=subprocess.STDOUT)
        while not (work / "ready").exists() and child.poll() is None:
            time.sleep(0.2)
        slurm("scontrol", "release", ",".join(ids))
        child.wait()
    rpcs, window_s = rpc_counts("sdiag"), time.monotonic() - reset_at
    dbd_rpcs = rpc_counts("sacctmgr", "show", "stats")
    if child.returncode != 0:
        raise RuntimeError(f"the waiting process failed ({child.returncode}); see {work / 'triggerer.log'}")
    waited = json.loads((work / "result.json").read_text())
    outcomes = slurm_outcomes(ids)
    slurm("scancel", ",".join(ids), timeout=120)  # held or pending ones: nothing outlives the phase
    for result, job_id, job in zip(waited["results"], ids, jobs, strict=True):
        result["slurm"], result["meant_to_fail"] = outcomes.get(job_id, "UNKNOWN"), job["meant_to_fail"]
    dbd_job_queries = dbd_rpcs.get("DBD_GET_JOBS_COND", 0)
    return summarise(waited, rpcs, window_s, sshd, load_start, dbd_job_queries=dbd_job_queries)


def deadline_s(side: str, count: int, seconds: float) -> float:
    """pcflow waits for every wave of jobs; the peer's waits are cut sooner: past a hundred connections
    they bring this shared machine to a standstill (a load of 200 was seen), and other work runs here."""
    if side == "peer":
        return 90 + 3 * seconds
    return 120 + (count / 200 + 1) * (2 * seconds + 30)


#: Synthetic job ids start here, far above the stack's own (PCFLOW_FIRST_JOB_ID is in the thousands).
SYNTHETIC_FIRST_ID = 9_000_000


def synthetic_jobs(stack: dict, side: str, count: int, seconds: float, spread: float) -> tuple[list[dict], Path]:
    """`count` jobs of the synthetic Slurm (benchmarks/synthetic_slurm.py), installed fresh for the phase:
    their run directories on the shared root, their ids, and the directory of its commands."""
    import synthetic_slurm

    from pcflow.slurm.spec import RunDir

    label = f"synthetic-{side}-{count}"
    fake = synthetic_slurm.install(stack["dir"] / "bench" / f"{label}-slurm")
    run_key = f"bench-{label}-{uuid.uuid4().hex[:8]}"
    first = SYNTHETIC_FIRST_ID + int(time.time()) % 100_000 * 10
    jobs = []
    for i in range(count):
        code = 3 if i % FAIL_EVERY == FAIL_EVERY - 1 else 0
        run_dir = RunDir.for_job(str(stack["shared"]), run_key, f"t{i}")
        job_id = str(first + i)
        # Ends spread evenly over `spread` s from `seconds` after the release (set then): about
        # count / spread ends a second, each wait concurrent with all the others.
        offset = seconds + spread * i / count
        jobs.append({"run_dir": run_dir, "job_id": job_id, "meant_to_fail": code != 0, "offset": offset, "code": code})
    return jobs, fake


def synthetic_triggers(side: str, jobs: list[dict], fake: Path) -> list[list]:
    """The waits' kwargs: pcflow's as its operator makes them, then pointed at the synthetic Slurm
    (`slurm_bin`, as the connection's extra names it; accounting on: it answers sacct)."""
    if side == "peer":
        return peer_triggers(jobs, [j["job_id"] for j in jobs])
    from pcflow.slurm.operators import SlurmJobOperator

    ops = [{"op": SlurmJobOperator(task_id=f"t{i}", program=["true"]), **j} for i, j in enumerate(jobs)]
    triggers = pcflow_triggers(ops, [j["job_id"] for j in jobs])
    for _, kwargs in triggers:
        kwargs.update(slurm_bin=str(fake), accounting=True)
    return triggers


def run_synthetic_phase(stack: dict, side: str, count: int, seconds: float, spread: float) -> dict:
    """One side waiting for `count` synthetic jobs over the real sshd: the harness plays the cluster
    (benchmarks/synthetic_slurm.py), the child the triggerer, as in run_phase."""
    import synthetic_slurm

    jobs, fake = synthetic_jobs(stack, side, count, seconds, spread)
    table = synthetic_slurm.JobTable(fake)
    for i, job in enumerate(jobs):
        name = f"{posixpath_name(job['run_dir'].root)}.t{i}"
        table.submit(synthetic_slurm.Job(job["job_id"], job["run_dir"].root, name, math.inf, math.inf, job["code"]))
    table.save()
    work = stack["dir"] / "bench" / f"synthetic-{side}-{count}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    roots = [j["run_dir"].root for j in jobs]
    evidence = "exit.json" if side == "pcflow" else "peer_exit"
    spec = {
        "triggers": synthetic_triggers(side, jobs, fake),
        "stamps": [f"{root}/end" for root in roots],
        "ends": [f"{root}/{evidence}" for root in roots],
        "deadline_s": 120 + seconds + spread,
        "diagnose_ticks": side == "pcflow",
    }
    (work / "spec.json").write_text(json.dumps(spec))
    load_start, started, wall0 = os.getloadavg(), time.monotonic(), time.time()
    with SshdWatch(stack["dir"], stack["sshd_port"]) as sshd, open(work / "triggerer.log", "wb") as log:
        child = subprocess.Popen([sys.executable, __file__, "--wait", str(work)], stdout=log, stderr=subprocess.STDOUT)
        while not (work / "ready").exists() and child.poll() is None:
            time.sleep(0.2)
        release = time.time()
        for job in jobs:  # released: each runs from a second after the release to its end
            held = table.jobs[job["job_id"]]
            held.start, held.end = release + 1.0, release + job["offset"]
            table.schedule(held)
        while child.poll() is None:
            table.advance(time.time())
            time.sleep(0.05)
    if child.returncode != 0:
        raise RuntimeError(f"the waiting process failed ({child.returncode}); see {work / 'triggerer.log'}")
    window_s = time.monotonic() - started
    calls = synthetic_slurm.queries(fake, since=wall0)
    waited = json.loads((work / "result.json").read_text())
    for result, job in zip(waited["results"], jobs, strict=True):
        result["slurm"], result["meant_to_fail"] = table.jobs[job["job_id"]].state, job["meant_to_fail"]
    found = summarise(waited, calls, window_s, sshd, load_start, dbd_job_queries=calls["sacct"])
    found["synthetic_slurm_calls"] = calls
    return found


def posixpath_name(root: str) -> str:
    """The run key of a run directory `<...>/<run key>/<task>`: the job's name, as pcflow names it."""
    return Path(root).parent.name


def slurm_outcomes(ids: list[str]) -> dict[str, str]:
    """How Slurm says each job ended (its last attempt), from accounting: the referee of every verdict."""
    time.sleep(5)  # slurmdbd takes the last completions a moment after slurmctld
    out = slurm("sacct", "-n", "-P", "-X", "-j", ",".join(ids), "-o", "JobID,State")
    return {job_id: state.split()[0] for job_id, _, state in (line.partition("|") for line in out.splitlines())}


def summarise(
    waited: dict, rpcs: dict[str, int], window_s: float, sshd: SshdWatch, load_start: tuple, *, dbd_job_queries: int
) -> dict:
    """`window_s`: from sdiag's reset to the last event (the triggerer's start-up included); `dbd_job_queries`:
    sacct's questions to slurmdbd in that window (they cost slurmctld nothing). `rpcs`: slurmctld's RPCs by
    type, or the synthetic Slurm's calls by command (squeue and scontrol are its controller's)."""
    results = waited["results"]
    job_queries = sum(rpcs.get(name, 0) for name in (*JOB_QUERIES, "squeue", "scontrol"))
    wait_s = waited["wait_s"]
    return {
        "jobs": len(results),
        **verdicts(results),
        "ssh_connections_opened": sshd.accepted,
        "ssh_connections_peak_open": sshd.peak_open,
        "ssh_connections_dropped_by_sshd": sshd.dropped,
        "slurmctld_job_queries": job_queries,
        "slurmctld_job_queries_per_30s": round(job_queries / max(window_s / 30, 1.0), 2),
        "slurmdbd_job_queries": dbd_job_queries,
        "sdiag_window_s": round(window_s, 1),
        "slurmctld_rpcs": dict(sorted(rpcs.items(), key=lambda kv: -kv[1])),
        "wait_s": round(wait_s, 1),
        "triggerer_cpu_s": round(waited["cpu_s"], 2),
        "triggerer_startup_cpu_s": round(waited["startup_cpu_s"], 2),
        "triggerer_cpu_share_of_one_core": round(waited["cpu_s"] / wait_s, 3),
        "triggerer_peak_rss_mb": round(waited["peak_rss_mb"], 1),
        "triggerer_rss_before_triggers_mb": round(waited["baseline_rss_mb"], 1),
        "longest_event_loop_stall_s": round(waited["max_stall_s"], 3),
        **spread("latency", [r.get("latency_s") for r in results if r["slurm"] == "COMPLETED"]),
        **spread("end_file_delay", [r.get("end_file_delay_s") for r in results if r["slurm"] == "COMPLETED"]),
        **spread("detection", [r.get("detection_s") for r in results if r["slurm"] == "COMPLETED"]),
        **spread("failure_detection", [r.get("detection_s") for r in results if r["meant_to_fail"]]),
        **waited.get("ticks", {}),
        "failures": sorted(
            {f"{r['message'][:160]} (Slurm: {r['slurm']})" for r in results if r["status"] != "success"}
        )[:3],
        "load_avg_1m_start_end": [round(load_start[0], 2), round(os.getloadavg()[0], 2)],
    }


#: Slurm states in which the job never ends by itself in the phase: held after a failed launch, pending.
UNFINISHED = {"PENDING", "REQUEUED", "RUNNING", "SUSPENDED"}


def verdicts(results: list[dict]) -> dict[str, int]:
    """Each wait's verdict against Slurm's: lost is a job Slurm ended whose wait said nothing or otherwise.
    Failed by Slurm: the jobs that failed without being meant to (a launch failing under load)."""
    lost = unfinished = failed = on_purpose = 0
    for r in results:
        if r["slurm"] in UNFINISHED and "received" not in r:
            unfinished += 1  # the wait rightly still waits (here: launches failed under load, jobs held)
        elif r["slurm"] == "COMPLETED":
            lost += r["status"] != "success"
        else:
            on_purpose += r["meant_to_fail"]
            failed += not r["meant_to_fail"]
            lost += r["status"] != "failed"
    return {
        "jobs_lost": lost,
        "jobs_failed_on_purpose": on_purpose,
        "jobs_failed_by_slurm": failed,
        "jobs_slurm_never_finished": unfinished,
    }


def spread(name: str, values: list[float | None]) -> dict[str, float | None]:
    ordered = sorted(v for v in values if v is not None)
    if not ordered:
        return {f"{name}_median_s": None, f"{name}_p99_s": None, f"{name}_max_s": None}
    return {
        f"{name}_median_s": round(statistics.median(ordered), 3),
        f"{name}_p99_s": round(percentile(ordered, 0.99), 3),
        f"{name}_max_s": round(ordered[-1], 3),
    }


def percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- the triggerer side: every trigger's run() on one event loop -------------------------------------


def wait_all(work: Path) -> None:
    """The child process: build the triggers, say ready, wait for every event; write what it cost. CPU
    and the event loop's stalls are counted from the release of the jobs (the imports and the first
    connections before it are the triggerer's start-up, reported apart)."""
    spec = json.loads((work / "spec.json").read_text())
    classes = {
        c: getattr(importlib.import_module(c.rpartition(".")[0]), c.rpartition(".")[2]) for c, _ in spec["triggers"]
    }
    ticks = time_ticks() if spec["diagnose_ticks"] else None
    baseline_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    cpu0 = time.process_time()
    results, waited = asyncio.run(wait_events(spec, classes, work))
    for result, stamp, end in zip(results, spec["stamps"], spec["ends"], strict=True):
        time_the_end(result, Path(stamp), Path(end))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {
        "results": results,
        **waited,
        "startup_cpu_s": time.process_time() - cpu0 - waited["cpu_s"],
        "peak_rss_mb": peak,
        "baseline_rss_mb": baseline_rss,
        "ticks": tick_summary(ticks),
        "tick_starts": [t[0] for t in ticks or []],
    }
    (work / "result.json").write_text(json.dumps(out))


def time_the_end(result: dict, stamp: Path, end: Path) -> None:
    """latency: the program's last act -> the event; split at the end file (pcflow's marker, the peer's
    exit-code file): the job's own delay in writing it, then the wait's in noticing it."""
    if "received" not in result or not stamp.exists() or not end.exists():
        return
    ended, written = float(stamp.read_text()), end.stat().st_mtime
    result["latency_s"] = result["received"] - ended
    result["end_file_delay_s"] = written - ended
    result["detection_s"] = result["received"] - written


def time_ticks() -> list[tuple[float, float, int, float]]:
    """Diagnostics of pcflow's session: each tick's start, its duration (the stat and the hand-out of views),
    the waiters it served, and its stat's round trip to the head node alone."""
    from pcflow.slurm import session, statloop

    ticks: list[tuple[float, float, int, float]] = []
    tick, stat = session.HeadNodeSession._tick, statloop.StatLoop.stat
    stat_s = [0.0]

    async def timed_stat(self, paths, timeout):
        start = time.monotonic()
        try:
            return await stat(self, paths, timeout)
        finally:
            stat_s[0] = time.monotonic() - start

    async def timed(self, due, now):
        start, stat_s[0] = time.time(), 0.0
        await tick(self, due, now)
        ticks.append((start, time.time() - start, len(due), stat_s[0]))

    session.HeadNodeSession._tick = timed
    statloop.StatLoop.stat = timed_stat
    return ticks


def tick_summary(ticks: list[tuple[float, float, int, float]] | None) -> dict:
    if not ticks:
        return {}
    gaps = sorted(b[0] - a[0] for a, b in itertools.pairwise(ticks))
    durations, stats = sorted(t[1] for t in ticks), sorted(t[3] for t in ticks)
    return {
        "session_ticks": len(ticks),
        "tick_interval_median_s": round(statistics.median(gaps), 3) if gaps else None,
        "tick_interval_p99_s": round(percentile(gaps, 0.99), 3) if gaps else None,
        "tick_median_s": round(statistics.median(durations), 3),
        "tick_p99_s": round(percentile(durations, 0.99), 3),
        "stat_round_trip_median_s": round(statistics.median(stats), 3),
        "stat_round_trip_p99_s": round(percentile(stats, 0.99), 3),
        "waiters_per_tick_max": max(t[2] for t in ticks),
    }


async def wait_events(spec: dict, classes: dict, work: Path) -> tuple[list[dict], dict]:
    import structlog

    loop = asyncio.get_running_loop()
    worst = 0.0

    async def heartbeat() -> None:
        nonlocal worst
        while True:
            start = loop.time()
            await asyncio.sleep(0.1)
            worst = max(worst, loop.time() - start - 0.1)

    async def one(trigger_id: int, classpath: str, kwargs: dict) -> dict:
        structlog.contextvars.bind_contextvars(trigger_id=trigger_id)  # as the triggerer's run_trigger does
        async for event in classes[classpath](**kwargs).run():
            return {
                "received": time.time(),
                "status": event.payload.get("status"),
                "message": str(event.payload.get("message", "")),
            }
        return {"status": "no event", "message": "the trigger ended without an event"}

    tasks = [asyncio.create_task(one(i, c, k)) for i, (c, k) in enumerate(spec["triggers"])]
    await asyncio.sleep(STARTUP_S)  # every run() has started and connected: the jobs may go
    cpu0, wall0 = time.process_time(), time.monotonic()
    beat = asyncio.create_task(heartbeat())
    (work / "ready").touch()
    done, pending = await asyncio.wait(tasks, timeout=spec["deadline_s"])
    waited = {"cpu_s": time.process_time() - cpu0, "wait_s": time.monotonic() - wall0, "max_stall_s": worst}
    for task in pending:
        task.cancel()
    beat.cancel()
    lost = {"status": "lost", "message": f"no event within {spec['deadline_s']:.0f} s"}
    return [t.result() if t in done and not t.exception() else lost for t in tasks], waited


# -- the run --------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="50,200,1000")
    parser.add_argument("--peer-sizes", default="50,200")
    parser.add_argument("--job-seconds", type=float, default=20.0)
    parser.add_argument("--running-at-once", type=int, default=RUNNING_AT_ONCE)
    parser.add_argument(
        "--slurm",
        choices=("stack", "synthetic"),
        default="stack",
        help="stack: the local stack's real Slurm; synthetic: benchmarks/synthetic_slurm.py over the real sshd",
    )
    parser.add_argument("--spread-seconds", type=float, default=60.0, help="synthetic: the ends spread over this")
    parser.add_argument("--out", type=Path, help="the result file (default: by --slurm, in benchmarks/results)")
    parser.add_argument("--wait", type=Path, help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.wait:
        wait_all(args.wait)
        return 0

    from stacktools import start_for_script

    shared = start_for_script()
    stack_dir = Path(os.environ["PCFLOW_STACK_DIR"])
    stack = {
        "dir": stack_dir,
        "shared": shared,
        "sshd_port": json.loads((stack_dir / "ports.json").read_text())["sshd"],
    }
    sizes = [int(n) for n in args.sizes.split(",") if n]
    peer_sizes = [int(n) for n in args.peer_sizes.split(",") if n]
    if args.slurm == "synthetic":
        return run_synthetic(stack, sizes, peer_sizes, args)
    partition, oversubscribe, cpus = default_partition()
    shared_by = f"FORCE:{-(-args.running_at_once // cpus)}"
    slurm("scontrol", "update", f"PartitionName={partition}", f"OverSubscribe={shared_by}")
    pcflow, peer = {}, {}
    try:
        # pcflow first: the peer's many connections load the machine for a while after their phase.
        for side, counts, found in (("pcflow", sizes, pcflow), ("peer", peer_sizes, peer)):
            for n in counts:
                found[str(n)] = run_phase(stack, side, n, args.job_seconds)
                print(json.dumps({side: n, **found[str(n)]}), flush=True)
    finally:
        slurm("scontrol", "update", f"PartitionName={partition}", f"OverSubscribe={oversubscribe.split(':')[0]}")
    result = report(pcflow, peer, args.job_seconds, f"{shared_by} on {cpus} CPUs")
    (args.out or RESULTS).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


def run_synthetic(stack: dict, sizes: list[int], peer_sizes: list[int], args: argparse.Namespace) -> int:
    """Every phase against the synthetic Slurm; the result in trigger_scale_synthetic.json (or --out)."""
    seconds, spread = args.job_seconds, args.spread_seconds
    pcflow, peer = {}, {}
    for side, counts, found in (("pcflow", sizes, pcflow), ("peer", peer_sizes, peer)):
        for n in counts:
            found[str(n)] = run_synthetic_phase(stack, side, n, seconds, spread)
            print(json.dumps({side: n, **found[str(n)]}), flush=True)
    result = report(pcflow, peer, seconds, "none (synthetic Slurm: every job runs at once)")
    result["metrics"]["slurm"] = SYNTHETIC_NOTE
    result["metrics"]["job_seconds"] = f"ends spread evenly from {seconds:g} s to {seconds + spread:g} s after release"
    (args.out or RESULTS_SYNTHETIC).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


def ratio(theirs: float | None, ours: float | None, floor: float) -> float | None:
    """theirs / ours; None when the peer has no value (no wait of it ended: no latency to compare)."""
    return None if theirs is None or ours is None else round(theirs / max(ours, floor), 1)


def report(pcflow: dict, peer: dict, seconds: float, oversubscribe: str) -> dict:
    ratios = {}
    for n, theirs in peer.items():
        ours = pcflow.get(n)
        if ours:
            ratios[n] = {
                f"{what}_peer_over_pcflow": ratio(theirs[key], ours[key], floor)
                for what, key, floor in (
                    ("ssh_connections", "ssh_connections_opened", 1),
                    ("triggerer_cpu", "triggerer_cpu_s", 0.01),
                    ("latency_median", "latency_median_s", 0.001),
                )
            }
            ratios[n]["jobs_lost"] = {"peer": theirs["jobs_lost"], "pcflow": ours["jobs_lost"]}
    big = pcflow.get("1000")
    checks = {}
    if big:
        checks = {
            "ssh_connections_per_head_node_le_1": big["ssh_connections_opened"] <= 1,
            "job_queries_per_30s_le_1": big["slurmctld_job_queries_per_30s"] <= 1.0,
            "detection_after_marker_median_le_1s": (big["detection_median_s"] or 99) <= 1.0,
            "detection_after_marker_p99_le_3s": (big["detection_p99_s"] or 99) <= 3.0,
            "cpu_le_20pct_of_one_core": big["triggerer_cpu_share_of_one_core"] <= 0.20,
            "no_job_lost": big["jobs_lost"] == 0,
        }
    return {
        "benchmark": "trigger_scale",
        "metrics": {
            "notes": NOTES,
            "job_seconds": f"{seconds:g} to {2 * seconds - 1:g} (job i sleeps job_seconds + i % job_seconds)",
            "partition_oversubscribe": oversubscribe,
            "machine_cpus": os.cpu_count(),
            "pcflow": pcflow,
        },
        "peers": {PEER_NAME: peer, "ratios": ratios},
        "goal": GOAL,
        "goal_checks": checks,
        "goal_met": bool(checks) and all(checks.values()),
    }


if __name__ == "__main__":
    sys.exit(main())
