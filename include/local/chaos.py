"""`make chaos`: fault injection on the Celery deployment (airflow_services.py: scheduler, 2 triggerers, 2
Celery workers, PostgreSQL, Redis) and the local stack (the head node's sshd, slurmctld, the compute nodes'
slurmd), with training jobs running. One short `pretrain` run per fault: once its train task is at the
fault's moment (submitting its job, its job starting, or deferred while the job runs), one process is
SIGKILLed (kill -9, with what it started) and started again (triggerer-late: SIGSTOPped until the other
triggerer has taken its wait over, then SIGCONT). Then the run is followed to its end and measured:

- survived: the run ended as it would have (success; failed for a person's "mark failed");
- duplicates: Slurm jobs under the run's job name beyond the first (sacct --name: every sbatch counts);
- self_cancelled: those jobs CANCELLED, though no person stopped the task (the orchestrator's own doing);
- lost: the run's summary (the metrics task's return), its report and its model missing in S3;
- detection: seconds from the job's end (sacct End) to the train task's success (after recovery).

The table, then a JSON line `{"faults": N, "survived": N, "duplicates": 0, "self_cancelled": 0, "lost": 0}`.
tests/deploy/test_celery_deployment.py runs four of the faults on its own deployment (Chaos below).

Usage: chaos.py [--faults name,name] [--keep]   (the stack up: make stack-up; --keep leaves the
deployment up, in <stack dir>/chaos-deployment, for a look at its logs)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from airflow_services import FAILOVER_SETTINGS, ONE_MACHINE_SETTINGS, Deployment
from compose_model import fill_env_file
from stack import SERVICES, STATE, Layout, load_layout, running_pid, stack_env, start

#: Short training (a few steps an epoch, the payload's digits): a job that runs long enough for a fault to
#: land and its process to come back, and no longer.
RUN_CONF = {"tasks_per_node": 1, "hyperparameters": {"epochs": 3}}
DAG_ID = "pretrain"
RUN_TIMEOUT_S = 900
MOMENT_TIMEOUT_S = 600
#: How long a killed process stays down before it is started again.
DOWN_S = 5
#: "starting": a job allocated this recently (squeue's TimeUsed) has not got far into its program; slurmctld
#: saves its state a few seconds after a change, so a kill then finds the start missing from it (a kill while
#: the job is still pending loses nothing: it is recovered pending and starts).
STARTING_S = 2
#: How long a stopped triggerer waits, at most, for the other to take its wait over (10 s of stale heartbeat).
TAKEOVER_TIMEOUT_S = 120


@dataclass(frozen=True)
class Fault:
    """One process killed at one moment of the train task: `moment` is "submitting" (the task runs, its
    job not yet submitted or just), "starting" (its job just given its nodes: configuring, or running for at
    most STARTING_S, its program not yet under way) or "waiting" (deferred, its job RUNNING);
    `by_person` for a person's action, after which the run fails and its job is cancelled (by the
    orchestrator, on the person's word)."""

    name: str
    moment: str
    what: str
    by_person: bool = False


FAULTS = (
    Fault("worker-mid-submit", "submitting", "SIGKILL of the Celery worker (and its task) running train"),
    Fault("worker-sigterm", "submitting", "SIGTERM of the worker running train (a shutdown), then a new one"),
    Fault("worker-deferred", "waiting", "SIGKILL of the worker that ran train, its task deferred"),
    Fault("triggerer", "waiting", "SIGKILL of the triggerer holding train's wait"),
    Fault("triggerer-late", "waiting", "SIGSTOP of the triggerer holding train's wait until the other takes it"),
    Fault("scheduler", "waiting", "SIGKILL of the scheduler"),
    Fault("redis", "waiting", "SIGKILL of Redis (the Celery broker)"),
    Fault("postgres", "waiting", "SIGKILL of PostgreSQL's postmaster (the metadata DB), down briefly"),
    Fault("sshd", "waiting", "SIGKILL of the head node's sshd and its sessions (the waits' SSH)"),
    Fault("slurmd", "waiting", "SIGKILL of the slurmd of the compute node running the job"),
    Fault("mark-failed", "waiting", "a person marks the deferred train task failed", by_person=True),
    # Killed as its job starts, slurmctld recovers a state saved before the start: it drains the node
    # ("Duplicate jobid") and holds the job ("launch failed requeued held"); the train wait releases it
    # (docs/reliability.md).
    Fault("slurmctld", "starting", "SIGKILL of slurmctld as the job starts"),
)
BY_NAME = {fault.name: fault for fault in FAULTS}


@dataclass
class Outcome:
    """What one fault's run came to (a row of the table)."""

    fault: str
    run_id: str = ""
    state: str = ""
    expected: str = "success"
    jobs: list[str] = field(default_factory=list)
    states: list[str] = field(default_factory=list)
    duplicates: int = 0
    self_cancelled: int = 0
    lost: list[str] = field(default_factory=list)
    detection_s: float | None = None
    train_tries: int = 0
    person_said: bool | None = None  # a person's action: the log says the job was cancelled for it
    note: str = ""

    @property
    def survived(self) -> bool:
        """The run ended as it would have, with nothing duplicated, cancelled by pcflow itself or lost (and,
        for a person's action, the log saying so)."""
        clean = not (self.duplicates or self.self_cancelled or self.lost or self.person_said is False)
        return self.state == self.expected and clean


def signal_family(pid: int, sig: int) -> list:
    """Signal a process and every process it started; the processes signalled."""
    import psutil

    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    for member in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.send_signal(sig)
    return family


def kill_family(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal a process and every process it started, and wait for them to go."""
    import psutil

    psutil.wait_procs(signal_family(pid, sig), timeout=60)


class Chaos:
    """Faults injected into `deployment` (up, logged in) on the local stack `lay`, one run each."""

    def __init__(self, deployment: Deployment, lay: Layout, conf: dict | None = None, log: Callable = print):
        self.airflow, self.lay, self.conf, self.log = deployment, lay, conf or RUN_CONF, log
        self.env = {**os.environ, **stack_env(lay), **lay.slurm_env()}
        self.revived: list[str] = []

    # -- Slurm and S3, as the measures read them ----------------------------------------------------------
    def slurm(self, *argv: str) -> str:
        """A Slurm command's output ("" when it fails: slurmctld down is one of the faults)."""
        proc = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=60, check=False)
        return proc.stdout if proc.returncode == 0 else ""

    def jobs(self, name: str) -> list[list[str]]:
        """sacct's rows (JobID, State, End, NodeList) for every job submitted under `name`."""
        out = self.slurm(
            "sacct", "-n", "-X", "-P", "-S", "now-6hours", "--name", name, "-o", "JobID,State,End,NodeList"
        )
        return [line.split("|") for line in out.splitlines() if line.strip()]

    def job_name(self, run_id: str) -> str:
        from pcflow.naming import run_key

        return f"{run_key(DAG_ID, run_id)}.train"

    # -- Airflow ------------------------------------------------------------------------------------------
    def api(self, method: str, path: str, body: dict | None = None) -> dict:
        """The REST API, logging in again when the token or the api-server was lost with a fault."""
        for attempt in range(30):
            try:
                return self.airflow.api(method, path, body)
            except urllib.error.HTTPError as exc:
                if exc.code == 401:
                    with contextlib.suppress(Exception):
                        self.airflow.token = self.airflow.login()
                elif exc.code < 500 or attempt == 29:
                    raise
            except OSError:
                if attempt == 29:
                    raise
            time.sleep(2)
        raise AssertionError("unreachable")

    def train(self, run_id: str) -> dict:
        """The train task instance as the API has it now."""
        return self.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/train")

    def trigger(self) -> str:
        """A new run of `pretrain`, as the UI's form triggers it. The DAG may be missing for a while after a
        fault: the dag-processor times out on pretrain.py while it runs the failure callback of a task whose
        worker died (docs/reliability.md, known limits), and the API answers 404 until it parses it again."""
        deadline = time.monotonic() + 300
        while True:
            try:
                self.api("PATCH", f"/dags/{DAG_ID}", {"is_paused": False})
                body = {"logical_date": None, "conf": self.conf}
                return self.api("POST", f"/dags/{DAG_ID}/dagRuns", body)["dag_run_id"]
            except urllib.error.HTTPError as exc:
                if exc.code != 404 or time.monotonic() > deadline:
                    raise
                time.sleep(5)

    def at_moment(self, run_id: str, moment: str) -> dict:
        """Poll until train is at `moment`; returns its task instance then."""
        deadline, name = time.monotonic() + MOMENT_TIMEOUT_S, self.job_name(run_id)
        while time.monotonic() < deadline:
            ti = self.train(run_id)
            if moment == "submitting" and ti["state"] == "running" and ti.get("hostname"):
                return ti
            if moment == "waiting" and ti["state"] == "deferred":
                if any(row[1] == "RUNNING" for row in self.jobs(name)):
                    return ti
            if moment == "starting" and ti["state"] in ("running", "deferred") and self.starting(name):
                return ti
            if ti["state"] in ("success", "failed", "upstream_failed"):
                raise AssertionError(f"train ended {ti['state']} before the fault's moment ({moment})")
            time.sleep(1 if moment == "waiting" else 0.3)
        raise AssertionError(f"train not at {moment} in {MOMENT_TIMEOUT_S} s")

    def starting(self, name: str, within_s: float = 10) -> bool:
        """Whether a job under `name` is starting (configuring, or running for at most STARTING_S), asked of
        slurmctld (squeue: sacct lags behind) every 0.1 s for up to `within_s` once train runs: sbatch comes
        from the task a moment after it is running, and a job on idle nodes starts within seconds. A job
        first seen further on (a slow poll on a loaded machine) is a missed moment: said at once."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            for line in self.slurm("squeue", "-h", "-t", "all", "--name", name, "-o", "%T|%M").splitlines():
                state, _, used = line.partition("|")
                seconds = sum(int(p) * 60**i for i, p in enumerate(reversed(used.split(":"))) if p.isdigit())
                if state == "CONFIGURING" or (state == "RUNNING" and seconds <= STARTING_S):
                    return True
                if state != "PENDING":
                    raise AssertionError(f"the job was {state} for {used} when first seen: its start was missed")
            time.sleep(0.1)
        return False

    def follow(self, run_id: str) -> str:
        """The run's end state (or its state at the timeout), reviving what exits meanwhile."""
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while time.monotonic() < deadline:
            self.revive()
            state = self.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}")["state"]
            if state in ("success", "failed"):
                return state
            time.sleep(3)
        return "timeout"

    def revive(self) -> list[str]:
        """Start again each replica that exited, as compose's `restart: always` does (the scheduler, the
        dag-processor and the triggerers exit when their database connection fails); recorded in `revived`."""
        gone = [name for name in self.airflow.names() if self.airflow.processes.pid(name) is None]
        for name in gone:
            self.airflow.spawn(self.airflow.names()[name], name)
            self.revived.append(name)
        return gone

    # -- the faults ---------------------------------------------------------------------------------------
    def replica(self, name: str) -> None:
        """SIGKILL one replica of the deployment (with all it started), then start it again."""
        service = self.airflow.names()[name]
        self.airflow.kill(name)
        time.sleep(DOWN_S)
        self.airflow.spawn(service, name)

    def stack_service(self, name: str, whole_family: bool = True) -> None:
        """SIGKILL a service of the local stack (with its children, or alone), then start it again."""
        svc = next(s for s in SERVICES if s.name == name)
        pid = running_pid(self.lay, svc)
        if pid is None:
            raise AssertionError(f"{name} is not running")
        if whole_family:
            kill_family(pid)
        else:
            os.kill(pid, signal.SIGKILL)
        time.sleep(DOWN_S)
        start(self.lay, svc)

    def postgres(self) -> None:
        """SIGKILL of the postmaster; its backends exit with it; started again after DOWN_S."""
        postgres = self.airflow.postgres()
        pid = int((postgres.data / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        time.sleep(DOWN_S)
        for _ in range(30):  # its backends notice the postmaster's death and exit: then it starts
            with contextlib.suppress(Exception):
                postgres.start()
                return
            time.sleep(1)
        postgres.start()

    def redis(self) -> None:
        """SIGKILL of Redis (nothing persisted: the broker's queue is lost), then a new one."""
        self.airflow.kill("redis")
        time.sleep(DOWN_S)
        self.airflow.start_redis()

    def worker_sigterm(self, name: str) -> None:
        """A worker shut down as `docker stop` does (SIGTERM to its session), then a new one."""
        pid = self.airflow.processes.pid(name)
        if pid is not None:
            os.killpg(pid, signal.SIGTERM)
            deadline = time.monotonic() + 120
            while self.airflow.processes.pid(name) is not None and time.monotonic() < deadline:
                time.sleep(0.5)
        if self.airflow.processes.pid(name) is not None:
            self.airflow.kill(name)
        self.airflow.spawn(self.airflow.names()[name], name)

    def triggerer_of(self, ti: dict) -> str:
        """The triggerer replica running this deferred task's trigger."""
        trigger = ti.get("trigger") or {}
        jobs = self.api("GET", "/jobs?job_type=TriggererJob&limit=100")["jobs"]
        found = next((job["hostname"] for job in jobs if job["id"] == trigger.get("triggerer_id")), None)
        if found is None:
            raise AssertionError(f"no triggerer runs train's trigger: {trigger}")
        return found

    def assigned(self, run_id: str, ti: dict) -> dict:
        """Train's task instance once a triggerer holds its trigger (a trigger just deferred has none yet)."""
        deadline = time.monotonic() + TAKEOVER_TIMEOUT_S
        while not (ti.get("trigger") or {}).get("triggerer_id") and time.monotonic() < deadline:
            time.sleep(0.5)
            ti = self.train(run_id)
        return ti

    def late(self, run_id: str, ti: dict) -> str:
        """The triggerer holding train's wait stopped (SIGSTOP, with its trigger runner: alive, its heartbeat
        stale) until the other triggerer has taken the trigger over, then let go on (SIGCONT): it finds the
        trigger no longer its own, and Airflow cancels its copy as a user's action, calling `on_kill`."""
        ti = self.assigned(run_id, ti)
        name, holder = self.triggerer_of(ti), (ti.get("trigger") or {}).get("triggerer_id")
        pid, taken = self.airflow.processes.pid(name), "not taken over"
        signal_family(pid, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + TAKEOVER_TIMEOUT_S
            while time.monotonic() < deadline:
                now = self.train(run_id)
                if now["state"] != "deferred":
                    taken = f"train {now['state']} meanwhile"
                    break
                if (now.get("trigger") or {}).get("triggerer_id") not in (holder, None):
                    taken = "taken over"
                    break
                time.sleep(1)
        finally:
            signal_family(pid, signal.SIGCONT)
        return f"{name} stopped ({taken}); then its on_kill: {self.late_kill_said(run_id)}"

    def late_kill_said(self, run_id: str, timeout: float = 60) -> str:
        """What the late triggerer's `on_kill` did, as train's log says (it runs once the triggerer notices the
        trigger is no longer its own)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.said(run_id, "keeps running: Airflow cancelled this wait"):
                return "job kept"
            if self.said(run_id, "a person stopped this task"):
                return "job cancelled"
            time.sleep(2)
        return "no word in the log"

    def inject(self, fault: Fault, run_id: str, ti: dict) -> str:
        """Do `fault` to the process it names; returns which one it was."""
        if fault.name in ("worker-mid-submit", "worker-deferred"):
            self.replica(ti["hostname"])
            return ti["hostname"]
        if fault.name == "worker-sigterm":
            self.worker_sigterm(ti["hostname"])
            return ti["hostname"]
        if fault.name == "triggerer":
            name = self.triggerer_of(self.assigned(run_id, ti))
            self.replica(name)
            return name
        if fault.name == "triggerer-late":
            return self.late(run_id, ti)
        if fault.name == "scheduler":
            self.replica("airflow-scheduler-1")
            return "airflow-scheduler-1"
        if fault.name == "redis":
            self.redis()
        elif fault.name == "postgres":
            self.postgres()
        elif fault.name in ("sshd", "slurmctld"):
            self.stack_service(fault.name)
        elif fault.name == "slurmd":
            nodes = next((row[3] for row in self.jobs(self.job_name(run_id)) if row[1] == "RUNNING"), "")
            node = self.slurm("scontrol", "show", "hostnames", nodes).split()[0]  # node[1-2]: node1
            self.stack_service(f"slurmd-{node}", whole_family=False)  # its jobs' steps are not its children
            return f"slurmd-{node}"
        elif fault.name == "mark-failed":
            path = f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/train"
            self.api("PATCH", path, {"new_state": "failed"})
            return "train (marked failed)"
        return fault.name

    # -- the measures -------------------------------------------------------------------------------------
    def lost(self, run_id: str) -> list[str]:
        """What the run should have left and did not: its summary (the metrics task's return), its report
        and its model in S3, its final metrics."""
        import boto3

        try:
            entry = self.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/metrics/xcomEntries/return_value")
        except urllib.error.HTTPError:
            return ["summary"]
        summary = json.loads(entry["value"]) if isinstance(entry["value"], str) else entry["value"]
        missing = [] if (summary.get("metrics") or {}) else ["metrics"]
        s3 = boto3.client("s3")  # the stack's endpoint, CA and keys: in the environment (main, the tests)
        for what, uri in (("report", summary.get("report")), ("model", (summary.get("model") or {}).get("model"))):
            bucket, _, key = (uri or "").removeprefix("s3://").partition("/")
            try:
                if s3.head_object(Bucket=bucket, Key=key)["ContentLength"] <= 0:
                    missing.append(what)
            except Exception:
                missing.append(what)
        return missing

    def detection(self, run_id: str, rows: list[list[str]]) -> float | None:
        """Seconds from the last job's end (sacct, local time to the second) to train's end in Airflow."""
        ends = [r[2] for r in rows if r[2] not in ("Unknown", "None", "")]
        ti = self.train(run_id)
        if not ends or not ti.get("end_date"):
            return None
        job_end = max(datetime.fromisoformat(e) for e in ends).astimezone(UTC)
        task_end = datetime.fromisoformat(ti["end_date"].replace("Z", "+00:00"))
        return round((task_end - job_end).total_seconds(), 1)

    def said_by_person(self, run_id: str) -> bool:
        """Whether train's log (the triggerer's part of it) says its job was cancelled because a person
        stopped the task."""
        return self.said(run_id, "a person stopped this task")

    def said(self, run_id: str, text: str) -> bool:
        """Whether train's logs (every try, the triggerers' parts: one volume for all) contain `text`."""
        logs = Path(self.airflow.container("airflow-triggerer", "airflow-triggerer-1").path("/opt/airflow/logs"))
        folder = logs / f"dag_id={DAG_ID}" / f"run_id={run_id}" / "task_id=train"
        return any(text in f.read_text(errors="replace") for f in folder.glob("*.log*"))

    def measure(self, faults: tuple[Fault, ...], run_id: str, state: str) -> Outcome:
        """The run's row: its end, its Slurm jobs, what it left, how fast its job's end was seen."""
        name, rows = self.job_name(run_id), []
        for _ in range(30):  # accounting reaches slurmdbd a moment after the end
            rows = self.jobs(name)
            if rows and all(r[2] not in ("Unknown", "") for r in rows):
                break
            time.sleep(2)
        cancelled = [r for r in rows if r[1].startswith("CANCELLED")]
        by_person = any(fault.by_person for fault in faults)
        return Outcome(
            fault="+".join(fault.name for fault in faults),
            run_id=run_id,
            state=state,
            expected="failed" if by_person else "success",
            jobs=[r[0] for r in rows],
            states=[r[1] for r in rows],
            duplicates=max(len(rows) - 1, 0),
            self_cancelled=0 if by_person else len(cancelled),
            lost=[] if by_person else self.lost(run_id),
            detection_s=None if by_person else self.detection(run_id, rows),
            train_tries=self.train(run_id).get("try_number", 0),
        )

    def run(self, *faults: Fault) -> Outcome:
        """One run, its faults in turn (each at its moment: those while submitting first): trigger, wait for
        the moment, kill and restart, then follow the run to its end and measure it. A replica an earlier
        fault or test killed is started first, as compose's `restart: always` would have: triggerer-late
        needs the other triggerer to take the wait over."""
        if gone := self.revive():
            self.log(f"  started again before the run (compose's restart: always): {', '.join(gone)}")
        run_id, notes = self.trigger(), []
        self.revived.clear()
        for fault in faults:
            try:
                ti = self.at_moment(run_id, fault.moment)
            except AssertionError as exc:
                outcome = self.measure(faults, run_id, self.follow(run_id))
                outcome.note, outcome.state = str(exc), f"{outcome.state}, fault not injected"
                return outcome
            started = time.monotonic()
            killed = self.inject(fault, run_id, ti)
            self.log(f"  {fault.name}: {killed} killed and back in {time.monotonic() - started:.0f} s ({run_id})")
            notes.append(f"{killed} while train was {ti['state']}")
        outcome = self.measure(faults, run_id, self.follow(run_id))
        if outcome.expected == "failed":
            outcome.person_said = self.said_by_person(run_id)
        if self.revived:
            notes.append(f"exited and restarted (compose's restart: always): {', '.join(sorted(set(self.revived)))}")
        outcome.note = "; ".join(notes)
        return outcome


# -- the table ----------------------------------------------------------------------------------------------


def table(outcomes: list[Outcome]) -> str:
    """The figures as a Markdown table, one row per fault (docs/reliability.md keeps one)."""
    lines = [
        "| fault | survived | run | Slurm jobs | duplicates | self-cancelled | lost | detection (s) | tries | what |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        jobs = ", ".join(f"{j} {s}" for j, s in zip(o.jobs, o.states, strict=True)) or "none"
        delay = "-" if o.detection_s is None else f"{o.detection_s:.1f}"
        lost = ", ".join(o.lost) or "0"
        lines.append(
            f"| {o.fault} | {'yes' if o.survived else 'NO'} | {o.state} (expected {o.expected}) | {jobs} | "
            f"{o.duplicates} | {o.self_cancelled} | {lost} | {delay} | {o.train_tries} | {o.note} |"
        )
    return "\n".join(lines)


def totals(outcomes: list[Outcome]) -> dict[str, int]:
    """The JSON last line's figures."""
    return {
        "faults": len(outcomes),
        "survived": sum(o.survived for o in outcomes),
        "duplicates": sum(o.duplicates for o in outcomes),
        "self_cancelled": sum(o.self_cancelled for o in outcomes),
        "lost": sum(len(o.lost) for o in outcomes),
    }


def chaos_deployment(lay: Layout) -> Deployment:
    """`make chaos`'s own deployment (2 workers, 2 triggerers, failover settings), under the stack's state."""
    root = STATE / "chaos-deployment"
    env_file = root / ".env"
    if not env_file.exists():
        root.mkdir(parents=True, exist_ok=True)
        extra = {**stack_env(lay), "PCFLOW_OFFERED_PROFILES": "local", **ONE_MACHINE_SETTINGS, **FAILOVER_SETTINGS}
        fill_env_file(env_file, extra=extra)
    return Deployment(root, workers=2, triggerers=2)


def wait_for_dag(deployment: Deployment, dag_id: str, timeout: float = 300) -> None:
    """Until the dag-processor has parsed `dag_id`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(urllib.error.HTTPError):
            deployment.api("GET", f"/dags/{dag_id}")
            return
        time.sleep(2)
    raise AssertionError(f"{dag_id} not parsed in {timeout:.0f} s")


def main(argv: list[str] | None = None) -> int:
    """Up the deployment, each fault in turn, the table and the JSON line; down unless --keep."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", default=",".join(BY_NAME), help="comma-separated, of: " + ", ".join(BY_NAME))
    parser.add_argument("--keep", action="store_true", help="leave the deployment up afterwards")
    parser.add_argument("--json", type=Path, help="also write the outcomes here")
    args = parser.parse_args(argv)
    faults = [BY_NAME[name] for name in args.faults.split(",")]
    lay = load_layout(create=False)
    os.environ.update(stack_env(lay))  # a client of the stack, as the tests are: boto3 finds its endpoint
    deployment = chaos_deployment(lay)
    started = time.monotonic()
    try:
        deployment.start()
        wait_for_dag(deployment, DAG_ID)
        print(f"deployment up in {time.monotonic() - started:.0f} s ({deployment.url})", flush=True)
        chaos, outcomes = Chaos(deployment, lay, log=lambda line: print(line, flush=True)), []
        for fault in faults:
            began = time.monotonic()
            outcomes.append(chaos.run(fault))
            print(f"{fault.name}: {outcomes[-1].state} in {time.monotonic() - began:.0f} s", flush=True)
            if args.json:
                args.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=1))
    finally:
        if not args.keep:
            deployment.stop()
    host = os.uname()
    print(
        f"\n{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {host.nodename} ({os.cpu_count()} CPUs), "
        f"{time.monotonic() - started:.0f} s in all\n"
    )
    print(table(outcomes))
    print(json.dumps(totals(outcomes)))
    return 0 if totals(outcomes)["survived"] == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
