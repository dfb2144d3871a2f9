"""docker-compose.yaml's deployment, run for real on this host (no container engine): the environment,
commands and mounts Docker Compose resolves for its default services (a `.env` filled in as the README
says), PostgreSQL as metadata DB and Celery result backend, Redis as broker, airflow-init, the
api-server, scheduler, dag-processor, 2 Celery workers and 2 triggerers, each in its own process, home
and hostname. The deployment is started as `make airflow` starts it (include/local/airflow_ui.py, with
its own state directory and 2 of each), and stopped by it. One deployment for the module:

- `pretrain_sweep`, triggered through the REST API (as the UI does) with 4 single-task trials: the 4
  elements of its Slurm job array run at the same time while the train task is deferred (in a
  triggerer, holding no worker slot), and the run succeeds. While they run, the triggerer holding the
  wait is SIGKILLed: the other takes the wait over, the job is not submitted again, its end is noticed.
- a backfill of `pretrain_nightly` over 2 days, started with the real CLI: the worker running the
  first night's dataset stage is SIGKILLed mid-load; the stage is retried on the other worker,
  nothing is created twice, and both nights succeed on the shared network and image.
- a short version of `make chaos` (include/local/chaos.py): one `pretrain` run whose worker is SIGKILLed as
  train submits, whose triggerer is stopped until the other takes its wait over (its on_kill keeps the
  job), then the head node's sshd while its job runs; it succeeds with one Slurm job, none cancelled,
  nothing lost. And one run a person marks failed: its job is cancelled.
- the trigger form of `pretrain` in headless Chromium, after logging in as the first user.
- `make airflow` as a person uses it: the login it prints, a second `up` finding everything up, the
  form filled in and submitted in Chromium, the run's success, pcflow's page listing it; then `down`.
- lineage, read from the api-server as the UI's Assets view reads it: each night's partition and model.
- the pcflow page (pcflow.ui, served by the api-server behind Airflow's login) after those runs: the
  stack and its resources, each run's objective and cost, the sweep's leaderboard; the metrics task's
  extra link opens the report inside Airflow.

The evidence (task states and Slurm elements over time, sacct spans, who ran what) is kept in
tests/artifacts/<test>/."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict
from datetime import date, datetime, timedelta
from pathlib import Path

import pytest
from airflow_services import FAILOVER_SETTINGS, ONE_MACHINE_SETTINGS, Deployment

from deploy.browser import BrowserError, Chromium
from deploy.compose import REPO, fill_env_file
from deploy.services import install_postgres, install_redis

# Module fixtures (the deployment, the sweep, the backfill) start inside the first test that needs them.
pytestmark = [pytest.mark.stack, pytest.mark.slow, pytest.mark.timeout(1200)]

#: One node each, all at once: a trial has whole nodes of its own (`--exclusive`), and the stack has three.
TRIALS = [{"lr": 0.001}, {"lr": 0.002}, {"lr": 0.004}]
SWEEP_CONF = {"nodes": 1, "tasks_per_node": 1, "trials_at_once": 3, "trials": TRIALS, "hyperparameters": {"epochs": 1}}
#: Two nights, new for each test run: their runs' ids (backfill__<date>), so their run keys and Slurm job
#: names, are new too, and nothing an earlier run left on a reused stack is adopted.
FIRST_NIGHT = date(2020, 1, 1) + timedelta(days=random.randrange(2000))
NIGHTS = (FIRST_NIGHT.isoformat(), (FIRST_NIGHT + timedelta(days=1)).isoformat())
#: The nightly runs at 02:00 and --to-date is a moment (a bare date is its midnight): up to the 2nd night's.
BACKFILL_DATES = ("--from-date", NIGHTS[0], "--to-date", f"{NIGHTS[1]}T02:00:00+00:00")
NIGHTLY_CONF = {"tasks_per_node": 1, "hyperparameters": {"epochs": 1, "lr": 0.004}}
RUN_TIMEOUT_S = 720


AIRFLOW_UI = REPO / "include" / "local" / "airflow_ui.py"


def airflow_ui(root: Path, *args: str) -> subprocess.CompletedProcess:
    """`make airflow`'s command (`make airflow-down`'s with `down`), its state in `root`."""
    env = {**os.environ, "PCFLOW_AIRFLOW_DIR": str(root)}
    argv = [sys.executable, str(AIRFLOW_UI), *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=False)


@pytest.fixture(scope="module")
def deployment_dir(local_stack, image):
    """The deployment up, started by `make airflow`'s command: (its state directory, what `up` said).
    Its `.env` is the user's: README's steps, plus the local stack's connections as a user adds theirs,
    the emulator's profile offered as .env.example says for it (compose offers aws-gpu alone), and the
    settings above; `up` keeps a `.env` it finds. 2 workers and 2 triggerers, for the failovers."""
    if install_postgres() is None or install_redis() is None:
        pytest.skip("PostgreSQL or Redis is not installed and cannot be installed here (needs root + apt-get)")
    root = Path(tempfile.mkdtemp(prefix="pcflow-deploy-"))
    settings = {**local_stack.env, "PCFLOW_OFFERED_PROFILES": "local", **ONE_MACHINE_SETTINGS, **FAILOVER_SETTINGS}
    fill_env_file(root / ".env", extra=settings)
    # Its processes run the image's layout (pcflow from the wheel where the Dockerfile installs it, the
    # image's ENV), not this checkout's plugins/: what ships is what runs (tests/deploy/image.py).
    (root / "image-env.json").write_text(json.dumps(image.environment()))
    started = time.monotonic()
    try:
        image_env = ("--process-env", str(root / "image-env.json"))
        up = airflow_ui(root, "up", "--workers", "2", "--triggerers", "2", *image_env)
        assert up.returncode == 0, f"airflow_ui.py up failed:\n{up.stdout[-3000:]}\n{up.stderr[-5000:]}"
        print(f"deployment up in {time.monotonic() - started:.0f} s")
        yield root, up
    finally:
        airflow_ui(root, "down")
        shutil.rmtree(root, ignore_errors=True)
        # The runs keep the stack's network, image and data by design; this module leaves nothing behind.
        from dagrun import remove_stack

        remove_stack("local")


@pytest.fixture(scope="module")
def airflow(deployment_dir) -> Deployment:
    """The deployment as the tests drive it (REST API, CLI, its processes), logged in as the first user."""
    deployment = Deployment(deployment_dir[0])
    deployment.token = deployment.login()
    return deployment


def slurm(env: dict[str, str], *argv: str) -> str:
    return subprocess.run(
        list(argv), env={**os.environ, **env}, capture_output=True, text=True, check=True, timeout=60
    ).stdout


def slurm_elements(env: dict[str, str]) -> list[str]:
    return [line for line in slurm(env, "squeue", "-h", "-r", "-o", "%i|%T").splitlines() if line.strip()]


def wait_for_free_cpus(env: dict[str, str], needed: int, timeout: float = 300) -> None:
    """The local Slurm declares at least 4 CPUs whatever the host has (stack.py: max(host, 4), so small
    trials run side by side on a 2-core machine); wait until `needed` of them are idle."""
    declared = sum(int(c) for c in slurm(env, "sinfo", "-h", "-N", "-o", "%c").split())
    assert declared >= needed, (
        f"the local Slurm declares {declared} CPUs; {needed} trials side by side need {needed}: "
        "unset PCFLOW_SLURM_CPUS or set it to 4 or more, then restart the stack"
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        idle = sum(int(n.split("/")[1]) for n in slurm(env, "sinfo", "-h", "-N", "-o", "%C").split())
        if idle >= needed:
            return
        time.sleep(2)
    raise AssertionError(f"{needed} Slurm CPUs not free after {timeout}s; queue: {slurm_elements(env)}")


def element_spans(env: dict[str, str], job_id: int, count: int, timeout: float = 60) -> list[list[str]]:
    """sacct's start and end of each array element (accounting reaches slurmdbd a moment after the end)."""
    deadline = time.monotonic() + timeout
    while True:
        out = slurm(env, "sacct", "-j", str(job_id), "-X", "-n", "-P", "-o", "JobID,Start,End,State")
        rows = [line.split("|") for line in out.splitlines() if line]
        if (len(rows) == count and all("Unknown" not in (r[1], r[2]) for r in rows)) or time.monotonic() > deadline:
            return rows
        time.sleep(2)


def jobs_named(env: dict[str, str], name: str) -> set[str]:
    """Slurm jobs (an array counts once) submitted under `name` in the last hours: sbatch calls."""
    out = slurm(env, "sacct", "-n", "-X", "-P", "-S", "now-6hours", "--name", name, "-o", "JobID")
    return {line.split("_")[0] for line in out.split()}


def wait_for_dag(airflow: Deployment, dag_id: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            airflow.api("GET", f"/dags/{dag_id}")
            return
        except urllib.error.HTTPError:
            time.sleep(2)
    raise AssertionError(f"{dag_id} not parsed in {timeout}s:\n{airflow.log_tail('airflow-dag-processor-1')}")


def task_instances(airflow: Deployment, dag_id: str, run_id: str) -> dict[str, dict]:
    found = airflow.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances?limit=100")["task_instances"]
    return {ti["task_id"]: ti for ti in found}


def returned(airflow: Deployment, dag_id: str, run_id: str, task_id: str) -> dict:
    entry = airflow.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/return_value")
    return json.loads(entry["value"]) if isinstance(entry["value"], str) else entry["value"]


def triggerer_of(airflow: Deployment, ti: dict) -> str | None:
    """The replica (its hostname) whose triggerer runs this deferred task's trigger."""
    trigger = ti.get("trigger") or {}
    if trigger.get("triggerer_id") is None:
        return None
    jobs = airflow.api("GET", "/jobs?job_type=TriggererJob&limit=100")["jobs"]
    return next((job["hostname"] for job in jobs if job["id"] == trigger["triggerer_id"]), None)


# -- the sweep, and a triggerer lost while its train task waits ------------------------------------------


@pytest.fixture(scope="module")
def sweep(airflow, local_stack) -> dict:
    """Trigger the sweep and follow it to its end; once its elements all run and train waits in a
    triggerer, SIGKILL that triggerer. Returns the run, its samples and what was killed when."""
    env = local_stack.env
    wait_for_dag(airflow, "pretrain_sweep")
    wait_for_free_cpus(env, len(TRIALS))
    airflow.api("PATCH", "/dags/pretrain_sweep", {"is_paused": False})
    run = airflow.api("POST", "/dags/pretrain_sweep/dagRuns", {"logical_date": None, "conf": SWEEP_CONF})
    run_id, state, started = run["dag_run_id"], run["state"], time.monotonic()
    timeline, killed = [], None
    while state not in ("success", "failed") and time.monotonic() - started < RUN_TIMEOUT_S:
        before = datetime.now()  # sacct reports local wall-clock time, to the second
        tis = task_instances(airflow, "pretrain_sweep", run_id)
        state = airflow.api("GET", f"/dags/pretrain_sweep/dagRuns/{run_id}")["state"]
        elements = slurm_elements(env)
        train = tis.get("train", {})
        sample = {
            "from": before.isoformat(),
            "to": datetime.now().isoformat(),
            "run": state,
            "tasks": {task_id: ti["state"] for task_id, ti in tis.items()},
            "slurm": elements,
            "train_triggerer": triggerer_of(airflow, train) if train.get("state") == "deferred" else None,
        }
        timeline.append(sample)
        running = [e for e in elements if e.endswith("|RUNNING")]
        if killed is None and sample["train_triggerer"] and len(running) == len(TRIALS):
            airflow.kill(sample["train_triggerer"])
            killed = {"replica": sample["train_triggerer"], "at": datetime.now().isoformat(), "sample": len(timeline)}
        time.sleep(2)
    return {
        "run_id": run_id,
        "state": state,
        "timeline": timeline,
        "killed": killed,
        "seconds": time.monotonic() - started,
    }


def test_sweep_runs_its_array_elements_concurrently_while_deferred(airflow, sweep, local_stack, artifacts_dir):
    env, timeline = local_stack.env, sweep["timeline"]
    (artifacts_dir / "timeline.json").write_text(json.dumps(timeline, indent=1))
    assert sweep["state"] == "success", f"run ended {sweep['state']}; last sample {timeline[-1]}"
    job_id = returned(airflow, "pretrain_sweep", sweep["run_id"], "train")["job_id"]
    # 1. Slurm's accounting: the elements ran at the same time (every start before every end).
    rows = element_spans(env, job_id, len(TRIALS))
    assert len(rows) == len(TRIALS) and all("Unknown" not in r[1:3] for r in rows), rows
    latest_start = max(datetime.fromisoformat(r[1]) for r in rows)
    earliest_end = min(datetime.fromisoformat(r[2]) for r in rows)
    assert latest_start < earliest_end, f"array elements did not overlap: {rows}"
    # 2. Airflow, sampled inside that window: train was deferred — in a triggerer, holding no worker
    #    slot — while the elements ran, from the moment the worker handed the wait over (on an idle
    #    cluster the elements start at sbatch, a moment before that: 1-2 s here, 8 s under the test
    #    lanes' load) to the first end.
    overlap = [
        sample
        for sample in timeline
        if datetime.fromisoformat(sample["from"]) >= latest_start
        and datetime.fromisoformat(sample["to"]) <= earliest_end
    ]
    handed_over = next((i for i, s in enumerate(overlap) if s["tasks"]["train"] == "deferred"), None)
    assert handed_over is not None, f"train never deferred between {latest_start} and {earliest_end}: {overlap}"
    window = overlap[handed_over:]
    for sample in window:
        ours = [e for e in sample["slurm"] if e.startswith(f"{job_id}_") and e.endswith("|RUNNING")]
        assert len(ours) == len(TRIALS), sample
        assert sample["tasks"]["train"] == "deferred", sample
    idle_workers = [s for s in window if "running" not in s["tasks"].values()]
    assert idle_workers, "expected a moment with the elements running and no task instance running"
    (artifacts_dir / "evidence.json").write_text(
        json.dumps(
            {
                "job_id": job_id,
                "sacct": rows,
                "overlap": [latest_start.isoformat(), earliest_end.isoformat()],
                "samples_in_overlap": len(window),
                "samples_in_overlap_with_no_task_running": len(idle_workers),
                "run_seconds": sweep["seconds"],
            },
            indent=1,
        )
    )


def test_a_killed_triggerer_hands_the_wait_over_without_resubmitting(airflow, sweep, local_stack, artifacts_dir):
    """SIGKILL of the triggerer running the sweep's wait (its elements running): the other triggerer
    takes the trigger over once the dead one's heartbeat is stale, the job array is not submitted
    again (one job under the run's name in Slurm's accounting), and its end is noticed: train succeeds."""
    from pcflow.naming import run_key

    killed, timeline = sweep["killed"], sweep["timeline"]
    assert killed is not None, "train never waited in a triggerer while its elements ran"
    assert killed["replica"].startswith("airflow-triggerer-")
    after = [s for s in timeline[killed["sample"] :] if s["train_triggerer"]]
    assert after, "no sample of the deferred train task after the kill"
    successors = {s["train_triggerer"] for s in after} - {killed["replica"]}
    assert successors and successors <= {"airflow-triggerer-1", "airflow-triggerer-2"}, after[-1]
    assert timeline[-1]["tasks"]["train"] == "success", timeline[-1]
    name = f"{run_key('pretrain_sweep', sweep['run_id'])}.train"
    jobs = jobs_named(local_stack.env, name)
    assert len(jobs) == 1, f"sbatch ran {len(jobs)} times for {name}: {sorted(jobs)}"
    takeover = next(s for s in after if s["train_triggerer"] != killed["replica"])
    (artifacts_dir / "failover.json").write_text(
        json.dumps(
            {
                "killed": killed,
                "taken_over_by": takeover["train_triggerer"],
                "at": takeover["from"],
                "jobs": sorted(jobs),
            },
            indent=1,
        )
    )


# -- a backfill from the CLI, and a worker lost in the middle of a stage ----------------------------------


@pytest.fixture(scope="module")
def backfill(airflow, sweep) -> dict:
    """`airflow backfill create` for 2 nights; the worker running the first night's dataset stage is
    SIGKILLed (with the task it runs) once the load has begun writing. Runs after the sweep."""
    wait_for_dag(airflow, "pretrain_nightly")
    # Unpaused so the scheduler runs the backfill's runs (the deployment makes no runs of its own schedule).
    airflow.api("PATCH", "/dags/pretrain_nightly", {"is_paused": False})
    started = time.monotonic()
    cli = airflow.airflow(
        "backfill",
        "create",
        "--dag-id",
        "pretrain_nightly",
        *BACKFILL_DATES,
        "--dag-run-conf",
        json.dumps(NIGHTLY_CONF),
        "--reprocess-behavior",
        "none",
        "--max-active-runs",
        "1",
    )
    assert cli.returncode == 0, cli.stdout[-3000:] + cli.stderr[-3000:]
    killed, runs = None, []
    while time.monotonic() - started < len(NIGHTS) * RUN_TIMEOUT_S:
        runs = airflow.api("GET", "/dags/pretrain_nightly/dagRuns?run_type=backfill&limit=10")["dag_runs"]
        if airflow.api("GET", "/backfills?dag_id=pretrain_nightly")["backfills"][0]["completed_at"]:
            break
        pause = 2.0
        if killed is None and runs:
            first = min(runs, key=lambda r: r["logical_date"])
            dataset = task_instances(airflow, "pretrain_nightly", first["dag_run_id"]).get("dataset", {})
            if dataset.get("state") == "running" and dataset.get("hostname") and load_started(first):
                airflow.kill(dataset["hostname"])
                killed = {"replica": dataset["hostname"], "run_id": first["dag_run_id"], "try": dataset["try_number"]}
            elif dataset.get("state") in (None, "scheduled", "queued", "running"):
                pause = 0.5  # the load takes seconds: look often enough to catch it writing
        time.sleep(pause)
    states = {r["dag_run_id"]: r["state"] for r in runs}
    return {"cli": cli.stdout, "states": states, "killed": killed, "seconds": time.monotonic() - started}


def partition_versions(run: dict) -> dict[str, int]:
    """Every object version under the night's partition of the dataset bucket, by key."""
    import boto3

    from pcflow.dataset.manifest import partition_root

    counts: dict[str, int] = {}
    root = partition_root("datasets/digits", run["logical_date"][:10])
    pages = (
        boto3.client("s3").get_paginator("list_object_versions").paginate(Bucket="pcflow-local-datasets", Prefix=root)
    )
    for page in pages:
        for version in page.get("Versions", []):
            counts[version["Key"]] = counts.get(version["Key"], 0) + 1
    return counts


def load_started(run: dict) -> bool:
    with contextlib.suppress(Exception):
        return len(partition_versions(run)) > 0
    return False


def test_backfill_from_the_cli_runs_both_nights(airflow, backfill, artifacts_dir):
    (artifacts_dir / "backfill.json").write_text(json.dumps(backfill, indent=1))
    runs = sorted(
        airflow.api("GET", "/dags/pretrain_nightly/dagRuns?run_type=backfill")["dag_runs"],
        key=lambda r: r["logical_date"],
    )
    assert [r["state"] for r in runs] == ["success", "success"], backfill["states"]
    assert [r["conf"] for r in runs] == [NIGHTLY_CONF, NIGHTLY_CONF]  # --dag-run-conf reached every run
    outputs = [
        {task: returned(airflow, "pretrain_nightly", r["dag_run_id"], task) for task in ("dataset", "network", "image")}
        for r in runs
    ]
    assert [o["dataset"]["partition"] for o in outputs] == list(NIGHTS)
    assert outputs[0]["network"]["vpc_id"] == outputs[1]["network"]["vpc_id"]
    assert outputs[0]["image"]["image_id"] == outputs[1]["image"]["image_id"]


def test_a_killed_worker_s_stage_is_retried_elsewhere_creating_nothing_twice(airflow, backfill, artifacts_dir):
    """SIGKILL of the Celery worker (and its task processes) running the first night's dataset stage,
    once its load has written objects: the scheduler fails the task when its heartbeat stops, the retry
    runs on the other worker, and every object of the partition exists in exactly one version."""
    import boto3

    from pcflow.dataset.manifest import JOURNAL_KEY

    killed = backfill["killed"]
    assert killed is not None, "the dataset stage was never seen running with its load begun"
    tries = airflow.api("GET", f"/dags/pretrain_nightly/dagRuns/{killed['run_id']}/taskInstances/dataset/tries")[
        "task_instances"
    ]
    hosts = {t["try_number"]: (t["hostname"], t["state"]) for t in tries}
    assert hosts[killed["try"]][0] == killed["replica"] and hosts[killed["try"]][1] != "success", hosts
    final = max(hosts)
    assert final > killed["try"] and hosts[final] == (
        next(iter({"airflow-worker-1", "airflow-worker-2"} - {killed["replica"]})),
        "success",
    ), hosts
    run = airflow.api("GET", f"/dags/pretrain_nightly/dagRuns/{killed['run_id']}")
    versions = partition_versions(run)
    twice = {key: n for key, n in versions.items() if n > 1 and not key.endswith(JOURNAL_KEY)}
    assert versions and not twice, f"objects written more than once: {sorted(twice)[:10]} (of {len(twice)})"
    ec2 = boto3.client("ec2")
    vpcs = ec2.describe_vpcs(Filters=[{"Name": "tag:pcflow:stack", "Values": ["local"]}])["Vpcs"]
    shared = [v for v in vpcs if not any(t["Key"] == "pcflow:run" for t in v.get("Tags", []))]
    assert len(shared) == 1, [v["VpcId"] for v in shared]
    (artifacts_dir / "failover.json").write_text(
        json.dumps({"killed": killed, "tries": hosts, "objects": len(versions)}, indent=1)
    )


def test_each_night_s_partition_and_model_are_in_the_assets_view(airflow, backfill, artifacts_dir):
    """Lineage through the api-server, as the UI's Assets view reads it: the stack's dataset Asset has one
    event per night, from the night's `dataset` task (the killed try sent none, its retry one), naming its
    partition; the stack's model Asset one per night, naming the partition and content it was trained on.
    A screenshot of the dataset Asset's page is kept."""
    runs = airflow.api("GET", "/dags/pretrain_nightly/dagRuns?run_type=backfill")["dag_runs"]
    nights = {r["dag_run_id"]: r["logical_date"][:10] for r in runs}

    def events(name: str) -> tuple[dict, list[dict]]:
        (asset,) = [a for a in airflow.api("GET", f"/assets?name_pattern={name}")["assets"] if a["name"] == name]
        found = airflow.api("GET", f"/assets/events?asset_id={asset['id']}&source_dag_id=pretrain_nightly&limit=100")
        return asset, [e for e in found["asset_events"] if e["source_run_id"] in nights]

    dataset, announced = events("pcflow-dataset-local")
    _, models = events("pcflow-pretrained-encoder-local")
    (artifacts_dir / "asset-events.json").write_text(json.dumps({"dataset": announced, "model": models}, indent=1))
    assert sorted((nights[e["source_run_id"]], e["source_task_id"], e["extra"]["partition"]) for e in announced) == [
        (night, "dataset", night) for night in NIGHTS
    ]
    content = {e["source_run_id"]: e["extra"]["content_hash"] for e in announced}
    assert sorted((nights[e["source_run_id"]], e["extra"]["dataset"]["partition"]) for e in models) == [
        (night, night) for night in NIGHTS
    ]
    assert all(e["extra"]["dataset"]["content_hash"] == content[e["source_run_id"]] for e in models)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is not None:
        with Chromium(chromium) as browser:
            log_in(browser, airflow, f"/assets/{dataset['id']}")
            browser.wait_for("document.body.innerText.includes('pcflow-dataset-local')")
            browser.screenshot(artifacts_dir / "assets-view-dataset.png")


#: One field of the trigger form as the page shows it: the Param it edits (from the input's name/id
#: `element_<param>`), its label and help text, whether it is a select, a number input's bounds.
READ_SECTION = """(section => {
  const item = [...document.querySelectorAll('[data-scope=accordion][data-part=item]')]
    .find(i => i.querySelector('[data-part=item-trigger]').innerText.trim() === section);
  if (!item || item.getAttribute('data-state') !== 'open') return null;
  return [...item.querySelectorAll('[data-scope=field][data-part=root]')].map(f => {
    const names = new Set([...f.querySelectorAll('[id^="element_"], [name^="element_"]')]
      .map(e => (e.getAttribute('name') || e.id).replace(/^element_/, '')));
    const spin = f.querySelector('[role=spinbutton]');
    return {params: [...names], label: f.querySelector('[data-part=label]')?.innerText.replace('*', '').trim(),
            help: f.querySelector('[data-part=helper-text]')?.innerText ?? null,
            select: !!f.querySelector('[role=combobox]'), visible: f.getBoundingClientRect().height > 0,
            min: spin?.getAttribute('aria-valuemin') ?? null, max: spin?.getAttribute('aria-valuemax') ?? null};
  });
})"""


def log_in(browser, airflow: Deployment, page: str) -> None:
    """Open a page of the UI, logging in on the FAB auth manager's page as the first user on the way (the
    UI sends an unknown visitor there)."""
    browser.navigate(f"{airflow.url}{page}")
    browser.wait_for("document.querySelector('input[name=username]')")
    fill = "document.querySelector('input[name={}]').value = {};"
    browser.evaluate(fill.format("username", json.dumps(airflow.username)))
    browser.evaluate(fill.format("password", json.dumps(airflow.password)))
    browser.evaluate("document.querySelector('input[name=password]').form.submit()")


def open_trigger_form(browser, airflow: Deployment) -> None:
    """Log in, then open the DAG's trigger form."""
    log_in(browser, airflow, "/dags/pretrain")
    trigger = "[...document.querySelectorAll('button')].find(b => b.innerText.trim() === 'Trigger')"
    browser.wait_for(trigger)
    browser.click(trigger)
    browser.wait_for("document.querySelector('[data-scope=accordion][data-part=item-trigger]')")


def read_section(browser, section: str) -> list[dict]:
    """Open one accordion section of the form (one is open at a time) and read its fields; a select's
    options are read by opening its menu, as a user would."""
    header = (
        "[...document.querySelectorAll('[data-scope=accordion][data-part=item-trigger]')]"
        f".find(b => b.innerText.trim() === {json.dumps(section)})"
    )
    # The page may still be moving (spinners elsewhere animate forever: only finite animations count).
    settled = (
        "document.getAnimations()"
        ".every(a => a.playState !== 'running' || a.effect?.getTiming().iterations === Infinity)"
    )
    is_open = f"({header})?.closest('[data-part=item]')?.getAttribute('data-state') === 'open'"
    fields = None
    for _ in range(3):  # a click while the page still moves may miss; a user clicks again (never to close)
        if not browser.evaluate(is_open):
            browser.wait_for(settled, timeout=10)
            browser.click(header)
        with contextlib.suppress(BrowserError):
            fields = browser.wait_for(f"{READ_SECTION}({json.dumps(section)})", timeout=10)
            break
    if fields is None:
        raise BrowserError(f"the form's section {section!r} did not open after three clicks")
    for field in fields:
        if field["select"]:
            element = f"#element_{field['params'][0]}"
            options = f"[...document.querySelectorAll('{element} [role=option]')]"
            for _ in range(3):  # a click while the page still moves may miss; a user clicks again
                browser.wait_for(settled, timeout=10)
                browser.click(f"document.querySelector('{element} [role=combobox]')")
                with contextlib.suppress(BrowserError):
                    field["options"] = browser.wait_for(f"{options}.length && {options}.map(o => o.innerText)", 5)
                    break
            browser.evaluate("document.activeElement.blur()")  # closes the menu, keeps the value
    return fields


def test_trigger_form_renders_every_param(airflow, artifacts_dir):
    """The UI's trigger form for `pretrain`, in headless Chromium: every Param of the DAG is a field in
    its section, titled and described as the Param says; enums are selects offering exactly their
    values; integer bounds reach the number inputs. Screenshots of each section are kept."""
    from pcflow.pipeline import training_params

    chromium = chromium_or_skip()
    wait_for_dag(airflow, "pretrain")
    params = airflow.api("GET", "/dags/pretrain/details")["params"]  # the DAG's Params, as the UI reads them
    assert params.keys() == training_params().keys()
    sections = list(dict.fromkeys(p["schema"]["section"] for p in params.values()))
    shown: dict[str, dict] = {}
    with Chromium(chromium) as browser:
        open_trigger_form(browser, airflow)
        for section in sections:
            for field in read_section(browser, section):
                assert len(field["params"]) == 1, f"a field of {section} edits {field['params']}"
                shown[field["params"][0]] = {**field, "section": section}
            browser.screenshot(artifacts_dir / f"pretrain-trigger-form-{section.lower()}.png")
    (artifacts_dir / "pretrain-trigger-form.json").write_text(json.dumps(shown, indent=1))

    assert shown.keys() == params.keys(), f"Params without a field: {sorted(params.keys() - shown.keys())}"
    for name, param in params.items():
        field, schema = shown[name], param["schema"]
        assert field["visible"] and field["section"] == schema["section"], (name, field)
        assert field["label"] == schema["title"], (name, field)
        if param["description"]:
            assert field["help"] == param["description"], (name, field)
        if "enum" in schema:
            assert field["select"], f"{name}: enum not rendered as a select"
            shown_as = ["null" if v is None else str(v) for v in schema["enum"]]  # the UI's keys for values_display
            labels = [schema.get("values_display", {}).get(key, key) for key in shown_as]
            assert field["options"] == labels, (name, field)
        else:
            assert not field["select"], (name, field)
        if "minimum" in schema:
            assert (field["min"], field["max"]) == (str(schema["minimum"]), str(schema["maximum"])), (name, field)


# -- the pcflow page and the report inside Airflow, after the sweep and the backfill ------------------------

#: What the pcflow page shows, read from its DOM (its tables carry the stack, run and trial they show).
READ_PCFLOW_PAGE = """(doc => ({
  stacks: [...doc.querySelectorAll('.stack')].map(s => ({stack: s.dataset.stack, title: s.querySelector('h3').innerText,
    kinds: [...new Set([...s.querySelectorAll('tr[data-kind]')].map(r => r.dataset.kind))]})),
  dags: Object.fromEntries([...doc.querySelectorAll('.dag')].map(d => [d.dataset.dag, {
    charts: d.querySelectorAll('svg.chart').length,
    runs: [...d.querySelectorAll('tr[data-run]')].map(r => ({run: r.dataset.run,
      outcome: r.querySelector('.outcome').innerText, objective: r.querySelector('.objective').innerText,
      cost: r.querySelector('.cost').innerText, report: r.querySelector('a.report')?.href ?? null}))}])),
  boards: [...doc.querySelectorAll('.leaderboard')].map(b => ({run: b.dataset.run,
    trials: [...b.querySelectorAll('tr[data-trial]')]
      .map(r => [Number(r.dataset.trial), r.querySelector('.value').innerText])})),
  janitor: doc.querySelector('#janitor').innerText,
}))"""


def refused(airflow: Deployment, path: str, headers: dict[str, str]) -> int:
    """The HTTP status the api-server answers a request for a page of the plugin with these headers."""
    try:
        with urllib.request.urlopen(urllib.request.Request(airflow.url + path, headers=headers), timeout=30):
            return 200
    except urllib.error.HTTPError as exc:
        return exc.code


def chromium_or_skip() -> str:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium not installed")
    return chromium


def backfill_nights(airflow: Deployment) -> list[dict]:
    runs = airflow.api("GET", "/dags/pretrain_nightly/dagRuns?run_type=backfill")["dag_runs"]
    return sorted(runs, key=lambda r: r["logical_date"])


def test_the_pcflow_page_shows_the_stack_runs_and_leaderboard(airflow, sweep, backfill, artifacts_dir):
    """The plugin's page in the real api-server, in headless Chromium after logging in, framed by the UI:
    the `local` stack with the resources its runs keep (found by tag) and their cost per day; each night
    of the backfill with the objective and cost its metrics task returned; the sweep's leaderboard in the
    ranks its metrics task gave, and its report opened from the page. Without Airflow's token: refused."""
    from pcflow.metrics.report import fmt

    started = time.monotonic()
    for headers in ({}, {"Authorization": "Bearer forged"}):
        assert refused(airflow, "/pcflow/", headers) in (401, 403), headers
    with Chromium(chromium_or_skip()) as browser:
        log_in(browser, airflow, "/plugin/pcflow")  # the page in the UI's navigation: framed by Airflow
        frame = "document.querySelector('iframe')?.contentDocument"
        browser.wait_for(f"!!{frame}?.querySelector('#leaderboards')", timeout=120)  # the frame's own Node
        browser.screenshot(artifacts_dir / "pcflow-page-in-airflow.png")
        shown = browser.evaluate(f"{READ_PCFLOW_PAGE}({frame})")
        browser.navigate(f"{airflow.url}/pcflow/")  # the page on its own, whole, for the screenshot
        browser.wait_for("document.querySelector('#leaderboards')")
        browser.screenshot(artifacts_dir / "pcflow-page.png")
        browser.click("document.querySelector('.dag[data-dag=pretrain_sweep] a.report')")  # the sweep's report
        browser.wait_for("document.querySelector('table#leaderboard')")
        browser.screenshot(artifacts_dir / "sweep-leaderboard-in-airflow.png")
    (artifacts_dir / "pcflow-page.json").write_text(json.dumps(shown, indent=1))
    local = next((s for s in shown["stacks"] if s["stack"] == "local"), None)
    assert local is not None, shown["stacks"]
    assert {"vpc", "subnet", "image"} <= set(local["kinds"]) and "per day" in local["title"], local
    runs = {r["run"]: r for r in shown["dags"]["pretrain_nightly"]["runs"]}
    assert shown["dags"]["pretrain_nightly"]["charts"] == 2  # the objective's and the cost's trend
    for run in backfill_nights(airflow):
        summary, row = returned(airflow, "pretrain_nightly", run["dag_run_id"], "metrics"), runs[run["dag_run_id"]]
        assert row["outcome"] == summary["outcome"] == "completed", row
        objective = summary["objective"]
        assert row["objective"] == f"{objective['name']} {fmt(objective['value'])}", (row, objective)
        assert row["cost"] == fmt(summary["cost_usd_estimate"]), (row, summary["cost_usd_estimate"])
    leaderboard = returned(airflow, "pretrain_sweep", sweep["run_id"], "metrics")["leaderboard"]
    board = next(b for b in shown["boards"] if b["run"] == sweep["run_id"])
    assert board["trials"] == [[r["trial"], fmt(r["value"])] for r in leaderboard] and len(leaderboard) == len(TRIALS)
    (artifacts_dir / "timing.json").write_text(json.dumps({"seconds": round(time.monotonic() - started, 1)}))


def test_the_metrics_task_s_extra_link_opens_the_report_inside_airflow(airflow, backfill, artifacts_dir):
    """The *Metrics report* button of a night's metrics task (its Details tab) points into Airflow, not to
    the S3 console: a click opens the report in place, served with a policy that allows no script; without
    Airflow's token it is refused."""
    from pcflow.urls import report_path

    started = time.monotonic()
    night = backfill_nights(airflow)[-1]["dag_run_id"]
    link = "[...document.querySelectorAll('a')].find(a => a.innerText.trim() === 'Metrics report')"
    with Chromium(chromium_or_skip()) as browser:
        log_in(browser, airflow, "/dags/pretrain_nightly")
        browser.wait_for("location.pathname.endsWith('/dags/pretrain_nightly')")  # logged in and back
        task = f"/dags/pretrain_nightly/runs/{urllib.parse.quote(night, safe='')}/tasks/metrics/details"
        browser.navigate(airflow.url + task)  # the task instance's Details tab lists its extra links
        browser.wait_for(link, timeout=120)
        browser.screenshot(artifacts_dir / "metrics-task-extra-links.png")
        href, target = browser.evaluate(f"[({link}).getAttribute('href'), ({link}).target]")
        browser.click(link)  # same origin: the UI opens it in place (target _self), inside Airflow
        browser.wait_for("document.title.startsWith('pcflow run')")
        title = browser.evaluate("document.title")
        browser.screenshot(artifacts_dir / "report-in-airflow.png")
    assert href == report_path("pretrain_nightly", night, "") and target == "_self", (href, target)
    assert title.startswith("pcflow run"), title
    request = urllib.request.Request(airflow.url + href, headers={"Authorization": f"Bearer {airflow.token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        policy = response.headers["Content-Security-Policy"]
    assert "default-src 'none'" in policy and "sandbox" in policy and "script-src" not in policy, policy
    assert refused(airflow, href, {}) == 401
    (artifacts_dir / "timing.json").write_text(json.dumps({"seconds": round(time.monotonic() - started, 1)}))


# -- faults: a short version of `make chaos`, on this module's deployment -----------------------------------

#: One pretrain run, three faults (include/local/chaos.py): its worker SIGKILLed while train submits, then
#: the triggerer holding the wait stopped until the other takes it over, then the head node's sshd (with its
#: sessions) while the job runs; each started again. `make chaos` runs them all, a run each.
CI_FAULTS = ("worker-mid-submit", "triggerer-late", "sshd")
#: Training long enough for the three faults to land while the job runs (`make chaos`'s runs: 3 epochs).
CI_CONF = {"tasks_per_node": 1, "hyperparameters": {"epochs": 8}}


def test_a_run_survives_its_worker_killed_mid_submit_its_triggerer_late_and_its_sshd_killed(airflow, artifacts_dir):
    """Issue 28: kill -9 of the worker running train as it submits (the scheduler fails the task when its
    heartbeat stops; the retry adopts the job, or submits the one that never was); then the triggerer
    holding the wait SIGSTOPped until the other triggerer has taken it over, and let go on: Airflow cancels
    the late one's copy as a user's action, and its on_kill, told the task is still deferred, keeps the job;
    then the head node's sshd killed while the job runs (the wait's connection drops; it reconnects once
    sshd is back, and notices the job's end). The run succeeds with one Slurm job under its name, none
    cancelled by pcflow, and its summary, report and model in S3."""
    from chaos import BY_NAME, Chaos, table
    from stack import load_layout

    started = time.monotonic()
    wait_for_dag(airflow, "pretrain")
    chaos = Chaos(airflow, load_layout(create=False), conf=CI_CONF, log=print)
    outcome = chaos.run(*(BY_NAME[name] for name in CI_FAULTS))
    (artifacts_dir / "chaos.md").write_text(table([outcome]) + "\n")
    seconds = round(time.monotonic() - started, 1)
    (artifacts_dir / "chaos.json").write_text(json.dumps({**asdict(outcome), "seconds": seconds}, indent=1))
    assert outcome.state == "success", outcome
    assert outcome.duplicates == 0 and len(outcome.jobs) == 1, outcome
    assert outcome.self_cancelled == 0 and outcome.states == ["COMPLETED"], outcome
    assert outcome.lost == [], outcome
    assert outcome.train_tries >= 2, f"train was not retried after its worker was killed: {outcome}"
    assert "taken over); then its on_kill: job kept" in outcome.note, f"the late triggerer's on_kill: {outcome}"


def test_a_person_s_mark_failed_cancels_the_deferred_job_and_says_so(airflow, artifacts_dir):
    """Issue 28, point 2, the other side: a person marks the deferred train task failed; the triggerer cancels
    the trigger as a user's action and calls its on_kill: the run's one job is cancelled and train's log
    says a person stopped the task."""
    from chaos import BY_NAME, Chaos, table
    from stack import load_layout

    started = time.monotonic()
    chaos = Chaos(airflow, load_layout(create=False), log=print)
    outcome = chaos.run(BY_NAME["mark-failed"])
    (artifacts_dir / "chaos.md").write_text(table([outcome]) + "\n")
    seconds = round(time.monotonic() - started, 1)
    (artifacts_dir / "chaos.json").write_text(json.dumps({**asdict(outcome), "seconds": seconds}, indent=1))
    assert outcome.state == "failed" and len(outcome.jobs) == 1, outcome
    assert outcome.states[0].startswith("CANCELLED"), f"the person's mark-failed did not cancel the job: {outcome}"
    assert outcome.person_said, f"train's log does not say a person stopped it: {outcome}"


# -- `make airflow`: the UI as a person uses it, then `make airflow-down` ---------------------------------

#: The form's field for the run's data partition, and the dialog's button that submits it.
PARTITION_FIELD = (
    "document.querySelector('[data-scope=accordion] input#element_partition, input[name=element_partition]')"
)
SUBMIT = "[...document.querySelectorAll('[role=dialog] button')].find(b => b.innerText.trim() === 'Trigger')"


def printed_login(output: str) -> dict[str, str]:
    """The URL and the login `make airflow` ends its output with."""
    found = re.search(
        r"^Airflow UI: (\S+)\n  username: (\S+)\n  password: (.*?)   \(kept in (\S+), mode 0600\)$", output, re.M
    )
    assert found, output
    return dict(zip(("url", "username", "password", "kept_in"), found.groups(), strict=True))


def said(output: str) -> dict[str, str]:
    """What `up` or `down` said of each service (the lines before its summary)."""
    lines = output.split("Airflow UI: ", maxsplit=1)[0].splitlines()
    return dict(line.split(None, 1) for line in lines if line.strip() and not line.startswith("airflow down"))


def trigger_from_the_form(airflow: Deployment, partition: str, artifacts_dir: Path) -> None:
    """Log in, open pretrain's trigger form, type the partition over its field's default and submit."""
    with Chromium(chromium_or_skip()) as browser:
        open_trigger_form(browser, airflow)
        read_section(browser, "Data")
        browser.click(PARTITION_FIELD)
        browser.evaluate(f"({PARTITION_FIELD}).select()")  # its text (the DAG's default), as Ctrl+A selects it
        browser.type_text(partition)
        browser.wait_for(f"({PARTITION_FIELD}).value === {json.dumps(partition)}", timeout=10)
        browser.screenshot(artifacts_dir / "pretrain-form-filled.png")
        browser.click(SUBMIT)
        browser.wait_for(f"!({SUBMIT})", timeout=30)  # the dialog closes once the run is created


def run_with_partition(airflow: Deployment, partition: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = airflow.api("GET", "/dags/pretrain/dagRuns?limit=100")["dag_runs"]
        mine = [r for r in found if (r.get("conf") or {}).get("partition") == partition]
        if mine:
            return mine[0]
        time.sleep(1)
    raise AssertionError(f"no pretrain run with partition {partition} after submitting the form")


def follow(airflow: Deployment, run_id: str) -> dict:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    run = airflow.api("GET", f"/dags/pretrain/dagRuns/{run_id}")
    while run["state"] not in ("success", "failed") and time.monotonic() < deadline:
        time.sleep(3)
        run = airflow.api("GET", f"/dags/pretrain/dagRuns/{run_id}")
    return run


def test_make_airflow_lets_a_person_trigger_pretrain_from_the_form(airflow, deployment_dir, artifacts_dir):
    """`make airflow` as a person uses it: it prints the UI's URL and a login kept in a 0600 file; a
    second `up` finds every service up and prints the same. In Chromium with that login: pretrain's
    trigger form, its Data partition typed in, Trigger; the run carries that partition, succeeds, and
    pcflow's page lists it with the outcome and cost its metrics task returned."""
    from pcflow.metrics.report import fmt

    root, first = deployment_dir
    login = printed_login(first.stdout)
    assert (login["url"], login["username"], login["password"]) == (airflow.url, airflow.username, airflow.password)
    assert Path(login["kept_in"]).stat().st_mode & 0o777 == 0o600
    # Earlier tests of this module kill a worker and a triggerer: `up` starts those again, and only those.
    down = {name for name, pid in airflow.status().items() if not pid}
    again = airflow_ui(root, "up")
    assert again.returncode == 0, again.stderr[-3000:]
    assert printed_login(again.stdout) == login
    states = said(again.stdout)
    assert states.keys() == {"postgres", "redis", *airflow.names()}, states
    for name, state in states.items():
        assert state.startswith("started" if name in down else "already up"), (name, states)

    partition = f"ui-{random.randrange(16**8):08x}"
    wait_for_dag(airflow, "pretrain")
    trigger_from_the_form(airflow, partition, artifacts_dir)
    run = follow(airflow, run_with_partition(airflow, partition)["dag_run_id"])
    states = {t: ti["state"] for t, ti in task_instances(airflow, "pretrain", run["dag_run_id"]).items()}
    assert run["state"] == "success", states
    summary = returned(airflow, "pretrain", run["dag_run_id"], "metrics")
    with Chromium(chromium_or_skip()) as browser:
        log_in(browser, airflow, "/plugin/pcflow")
        frame = "document.querySelector('iframe')?.contentDocument"
        browser.wait_for(f"!!{frame}?.querySelector('.dag[data-dag=pretrain] tr[data-run]')", timeout=120)
        browser.screenshot(artifacts_dir / "pcflow-page-lists-the-run.png")
        shown = browser.evaluate(f"{READ_PCFLOW_PAGE}({frame})")
    rows = {r["run"]: r for r in shown["dags"]["pretrain"]["runs"]}
    assert run["dag_run_id"] in rows, rows
    row = rows[run["dag_run_id"]]
    assert row["outcome"] == summary["outcome"] == "completed", row
    assert row["cost"] == fmt(summary["cost_usd_estimate"]), (row, summary)


def with_pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def test_make_airflow_down_stops_what_it_started(airflow, deployment_dir):
    """`make airflow-down`: every process `up` started, with all it started in its session, is gone, and
    the private PostgreSQL is stopped (its data kept); a second `down` finds nothing to stop."""
    import psutil

    root, _ = deployment_dir
    pids = airflow.status()
    assert all(pids.values()), pids
    postgres = airflow.postgres()
    assert postgres.running()
    down = airflow_ui(root, "down")
    assert down.returncode == 0, down.stderr[-3000:]
    assert said(down.stdout).keys() == {"postgres", "redis", *airflow.names()}, down.stdout
    # Gone: exited, at most a zombie for init to reap (their parent, `up`, exited long ago).
    processes = psutil.process_iter(["pid", "name", "status"])
    left = [p.info for p in processes if p.info["status"] != psutil.STATUS_ZOMBIE and with_pgid(p.pid) in pids.values()]
    assert not left, left
    assert not postgres.running() and (postgres.data / "PG_VERSION").exists()
    again = airflow_ui(root, "down")
    assert set(said(again.stdout).values()) == {"not running"}, again.stdout
