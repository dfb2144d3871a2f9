"""The sweep under real Airflow services (no Docker): PostgreSQL metadata DB, api-server, scheduler,
dag-processor and triggerer, LocalExecutor with parallelism 2. `pretrain_sweep` is triggered through the
REST API (as the UI does) with 4 single-task trials: the 4 elements of its Slurm job array run at the
same time while the train task is deferred (in the triggerer, holding no executor slot), and the run
succeeds. The evidence (task-instance states and Slurm elements over time, sacct start/end) is kept in
tests/artifacts/<test>/. Then headless Chromium shows every Param of `pretrain` in its trigger form."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from deploy.browser import BrowserError, Chromium
from deploy.services import AirflowServices, Postgres, install_postgres

pytestmark = [pytest.mark.stack, pytest.mark.slow]

TRIALS = [{"lr": 0.001}, {"lr": 0.002}, {"lr": 0.004}, {"lr": 0.008}]
CONF = {"tasks_per_node": 1, "trials": TRIALS, "hyperparameters": {"epochs": 1}}
RUN_TIMEOUT_S = 720
#: From sbatch to "deferred": the worker renders the trigger and exits, the API server records it
#: (1-2 s on this 2-core machine). sacct truncates times to the second, hence one more.
HANDOFF_S = 4


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
    env = local_stack.env
    wait_for_dag(airflow, "pretrain_sweep")
    wait_for_free_cpus(env, len(TRIALS))
    airflow.api("PATCH", "/dags/pretrain_sweep", {"is_paused": False})
    run = airflow.api("POST", "/dags/pretrain_sweep/dagRuns", {"logical_date": None, "conf": CONF})
    run_id = run["dag_run_id"]
    timeline, started = [], time.monotonic()
    state = run["state"]
    while state not in ("success", "failed") and time.monotonic() - started < RUN_TIMEOUT_S:
        before = datetime.now()  # sacct reports local wall-clock time, to the second
        tis = airflow.api("GET", f"/dags/pretrain_sweep/dagRuns/{run_id}/taskInstances?limit=100")["task_instances"]
        state = airflow.api("GET", f"/dags/pretrain_sweep/dagRuns/{run_id}")["state"]
        elements = slurm_elements(env)
        timeline.append(
            {
                "from": before.isoformat(),
                "to": datetime.now().isoformat(),
                "run": state,
                "tasks": {ti["task_id"]: ti["state"] for ti in tis},
                "slurm": elements,
            }
        )
        time.sleep(2)
    (artifacts_dir / "timeline.json").write_text(json.dumps(timeline, indent=1))
    assert state == "success", f"run ended {state}; last sample {timeline[-1]}\n{airflow.log_tail('scheduler')}"

    job = airflow.api("GET", f"/dags/pretrain_sweep/dagRuns/{run_id}/taskInstances/train/xcomEntries/return_value")
    job_id = json.loads(job["value"])["job_id"] if isinstance(job["value"], str) else job["value"]["job_id"]
    # 1. Slurm's accounting: the 4 elements ran at the same time (every start before every end).
    rows = element_spans(env, job_id, len(TRIALS))
    assert len(rows) == len(TRIALS) and all("Unknown" not in r[1:3] for r in rows), rows
    latest_start = max(datetime.fromisoformat(r[1]) for r in rows)
    earliest_end = min(datetime.fromisoformat(r[2]) for r in rows)
    assert latest_start < earliest_end, f"array elements did not overlap: {rows}"
    # 2. Airflow, sampled inside that window: train was deferred — in the triggerer, holding no executor
    #    slot — while the 4 elements ran. The window opens HANDOFF_S after the last start: on an idle
    #    cluster the elements start at sbatch, a moment before the worker has handed the wait over.
    window = [
        sample
        for sample in timeline
        if datetime.fromisoformat(sample["from"]) >= latest_start + timedelta(seconds=HANDOFF_S)
        and datetime.fromisoformat(sample["to"]) <= earliest_end
    ]
    assert window, f"no sample between {latest_start} and {earliest_end}: sample more often"
    for sample in window:
        ours = [e for e in sample["slurm"] if e.startswith(f"{job_id}_") and e.endswith("|RUNNING")]
        assert len(ours) == len(TRIALS), sample
        assert sample["tasks"]["train"] == "deferred", sample
    idle_executor = [s for s in window if "running" not in s["tasks"].values()]
    assert idle_executor, "expected a moment with the 4 elements running and no task instance running"
    (artifacts_dir / "evidence.json").write_text(
        json.dumps(
            {
                "job_id": job_id,
                "sacct": rows,
                "overlap": [latest_start.isoformat(), earliest_end.isoformat()],
                "samples_in_overlap": len(window),
                "samples_in_overlap_with_no_task_running": len(idle_executor),
                "first_sample_in_overlap": window[0],
            },
            indent=1,
        )
    )


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


def open_trigger_form(browser, airflow: AirflowServices) -> None:
    # all_admins: the UI logs in with no credentials through this redirect.
    browser.navigate(f"{airflow.url}/auth/token/login?next={airflow.url}/dags/pretrain")
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

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium not installed")
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
