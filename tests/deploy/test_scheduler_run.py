"""The sweep under real Airflow services (no Docker): PostgreSQL metadata DB, api-server, scheduler,
dag-processor and triggerer, LocalExecutor with parallelism 2. `pretrain_sweep` is triggered through the
REST API (as the UI does) with 4 single-task trials: the 4 elements of its Slurm job array run at the
same time while the train task is deferred (in the triggerer, holding no executor slot), and the run
succeeds. The evidence (task-instance states and Slurm elements over time, sacct start/end) is kept in
tests/artifacts/<test>/. Then headless Chromium shows the `pretrain` trigger form with its Params."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path

import pytest

from deploy.services import AirflowServices, Postgres, install_postgres

pytestmark = [pytest.mark.stack, pytest.mark.slow]

TRIALS = [{"lr": 0.001}, {"lr": 0.002}, {"lr": 0.004}, {"lr": 0.008}]
CONF = {"tasks_per_node": 1, "trials": TRIALS, "hyperparameters": {"epochs": 1}}
RUN_TIMEOUT_S = 720


@pytest.fixture(scope="module")
def airflow(local_stack, tmp_path_factory):
    bindir = install_postgres()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed and cannot be installed here (needs root + apt-get)")
    root = Path(tempfile.mkdtemp(prefix="pcflow-pg-"))
    postgres = Postgres(root, bindir)
    services = None
    try:
        dsn = postgres.start()
        services = AirflowServices(tmp_path_factory.mktemp("airflow-home"), dsn, local_stack.env, parallelism=2)
        services.start()
        yield services
    finally:
        if services is not None:
            services.stop()
        postgres.stop()
        shutil.rmtree(root, ignore_errors=True)
        # The sweep keeps the stack's image and data by design; this module leaves nothing behind.
        from dagrun import remove_stack

        remove_stack("local")


def slurm_elements(env: dict[str, str]) -> list[str]:
    out = subprocess.run(
        ["squeue", "-h", "-r", "-o", "%i|%T"], env={**os.environ, **env}, capture_output=True, text=True, check=False
    ).stdout
    return [line for line in out.splitlines() if line.strip()]


def wait_for_dag(airflow: AirflowServices, dag_id: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            airflow.api("GET", f"/dags/{dag_id}")
            return
        except urllib.error.HTTPError:
            time.sleep(2)
    raise AssertionError(f"{dag_id} not parsed in {timeout}s:\n{airflow.log_tail('dag-processor')}")


def test_sweep_runs_four_array_elements_concurrently_while_deferred(airflow, local_stack, artifacts_dir):
    wait_for_dag(airflow, "pretrain_sweep")
    # The local Slurm is shared with other tests: start when its CPUs are free, so the 4 elements fit.
    for _ in range(150):
        if not slurm_elements(local_stack.env):
            break
        time.sleep(2)
    airflow.api("PATCH", "/dags/pretrain_sweep", {"is_paused": False})
    run = airflow.api("POST", "/dags/pretrain_sweep/dagRuns", {"logical_date": None, "conf": CONF})
    run_id = run["dag_run_id"]
    timeline, started = [], time.monotonic()
    state = run["state"]
    while state not in ("success", "failed") and time.monotonic() - started < RUN_TIMEOUT_S:
        tis = airflow.api("GET", f"/dags/pretrain_sweep/dagRuns/{run_id}/taskInstances?limit=100")["task_instances"]
        state = airflow.api("GET", f"/dags/pretrain_sweep/dagRuns/{run_id}")["state"]
        timeline.append(
            {
                "t": round(time.monotonic() - started, 1),
                "run": state,
                "tasks": {ti["task_id"]: ti["state"] for ti in tis},
                "slurm": slurm_elements(local_stack.env),
            }
        )
        time.sleep(2)
    (artifacts_dir / "timeline.json").write_text(json.dumps(timeline, indent=1))
    assert state == "success", f"run ended {state}; last sample {timeline[-1]}\n{airflow.log_tail('scheduler')}"

    job = airflow.api("GET", f"/dags/pretrain_sweep/dagRuns/{run_id}/taskInstances/train/xcomEntries/return_value")
    job_id = json.loads(job["value"])["job_id"] if isinstance(job["value"], str) else job["value"]["job_id"]
    ours = [
        {
            **sample,
            "elements": sorted(
                e.split("|")[0] for e in sample["slurm"] if e.startswith(f"{job_id}_") and "|RUNNING" in e
            ),
        }
        for sample in timeline
    ]
    # While 4 elements of the array ran at once, train was deferred: no task instance held a slot.
    overlap = [s for s in ours if len(s["elements"]) == 4]
    assert overlap, f"the 4 array elements of {job_id} were never seen running together"
    for sample in overlap:
        assert sample["tasks"]["train"] == "deferred", sample
        running = [task for task, ti_state in sample["tasks"].items() if ti_state == "running"]
        assert len(running) <= 2, sample  # parallelism 2: what the executor may hold; train is not among them
        assert "train" not in running
    deferred_without_slot = [s for s in overlap if not any(v == "running" for v in s["tasks"].values())]
    assert deferred_without_slot, "expected samples with 4 elements running and no task instance running"

    sacct = subprocess.run(
        ["sacct", "-j", str(job_id), "-X", "-n", "-P", "-o", "JobID,Start,End,State"],
        env={**os.environ, **local_stack.env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [line.split("|") for line in sacct.splitlines() if line]
    spans = [(datetime.fromisoformat(r[1]), datetime.fromisoformat(r[2])) for r in rows if r[1] != "Unknown"]
    assert len(spans) == 4, rows
    assert max(s for s, _ in spans) < min(e for _, e in spans), f"array elements did not overlap: {rows}"
    (artifacts_dir / "evidence.json").write_text(
        json.dumps(
            {
                "job_id": job_id,
                "sacct": rows,
                "samples_4_running": len(overlap),
                "samples_4_running_no_ti_running": len(deferred_without_slot),
                "first_overlap": overlap[0],
            },
            indent=1,
        )
    )


def test_trigger_form_renders_params(airflow, artifacts_dir):
    """The UI's trigger dialog for `pretrain`, opened in headless Chromium through the DevTools protocol."""
    from websockets.sync.client import connect

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium not installed")
    wait_for_dag(airflow, "pretrain")
    profile = tempfile.mkdtemp(prefix="pcflow-chromium-")
    flags = "--headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking "
    flags += "--disable-component-update --disable-sync --window-size=1400,2000 --remote-debugging-port=0"
    proc = subprocess.Popen(
        [chromium, *flags.split(), f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        port_file = Path(profile, "DevToolsActivePort")
        for _ in range(100):
            if port_file.exists() and port_file.read_text().strip():
                break
            time.sleep(0.2)
        port = port_file.read_text().split()[0]
        pages = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json").read())
        ws_url = next(p["webSocketDebuggerUrl"] for p in pages if p["type"] == "page")
        with connect(ws_url, max_size=64 * 2**20) as ws:
            counter = iter(range(1, 10**6))

            def cdp(method: str, **params):
                message_id = next(counter)
                ws.send(json.dumps({"id": message_id, "method": method, "params": params}))
                while True:
                    reply = json.loads(ws.recv(timeout=60))
                    if reply.get("id") == message_id:
                        return reply.get("result", {})

            def evaluate(expression: str):
                return cdp("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

            # all_admins: the UI logs in with no credentials through this redirect.
            cdp("Page.navigate", url=f"{airflow.url}/auth/token/login?next={airflow.url}/dags/pretrain")
            click = """(() => { const b = [...document.querySelectorAll('button')]
                .find(b => b.innerText.trim() === 'Trigger'); if (b) { b.click(); return true } return false })()"""
            text = ""
            for _ in range(60):
                time.sleep(1)
                if not text and evaluate(click):
                    text = "clicked"
                if text:
                    body = evaluate("document.body.innerText") or ""
                    if "Advanced Options" in body and "Resources" in body:
                        text = body
                        break
            # The Params' sections render as collapsed accordions: open each so its fields show.
            evaluate("""[...document.querySelectorAll('[data-part="item-trigger"], button')].filter(b => ['Where',
                'Data', 'Resources', 'Training', 'Cleanup'].includes(b.innerText.trim())).forEach(b => b.click())""")
            time.sleep(3)
            body = evaluate("document.body.innerText") or ""
            shot = cdp("Page.captureScreenshot", format="png", captureBeyondViewport=True)
            (artifacts_dir / "pretrain-trigger-form.png").write_bytes(base64.b64decode(shot["data"]))
            (artifacts_dir / "pretrain-trigger-form.txt").write_text(body)
        # The Params' `section`s, in the form's order (their fields show once a section is opened).
        for title in ("Trigger Dag - pretrain", "Where", "Data", "Resources", "Training", "Cleanup", "Advanced"):
            assert title in body, f"{title!r} not in the trigger form:\n{body[:3000]}"
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=20)
        shutil.rmtree(profile, ignore_errors=True)
