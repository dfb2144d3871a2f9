"""SlurmJobOperator against the real Slurm of the local stack, through the real sshd."""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
import uuid
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException
from stacktools import LocalStack, settled
from taskcontext import MemoryStateStore, deferred_trigger, first_event, make_context

from pcflow.jobstates import JobState
from pcflow.slurm.hook import SlurmConnectionError, SlurmHook
from pcflow.slurm.operators import STATE_KEY, SlurmArrayJobOperator, SlurmJobOperator

pytestmark = pytest.mark.stack

FAST = {"poll_interval": 0.2, "confirm_interval": 2.0}


def bash(script: str) -> list[str]:
    return ["bash", "-c", script]


defer = deferred_trigger


def run_to_completion(op: SlurmJobOperator, context: dict) -> dict:
    trigger = defer(op, context)
    return op.execute_complete(context, first_event(trigger))


def jobs_named(slurm: SlurmHook, name: str, settle_s: float = 3.0) -> list:
    """Every job of that name Slurm knows, once the answer has stopped changing for `settle_s`."""
    return settled(lambda: slurm.find_jobs(name), quiet_s=settle_s, timeout_s=30, every_s=0.5)


def test_success_streams_every_log_line_once_in_order(slurm: SlurmHook, capsys):
    op = SlurmJobOperator(
        task_id="train",
        program=bash('for i in $(seq 1 40); do echo "line $i"; sleep 0.02; done; cat "$PCFLOW_HPARAMS"'),
        hyperparameters={"lr": 0.1, "note": 'it\'s "quoted" $(not run)'},
        **FAST,
    )
    context = make_context("train")
    result = run_to_completion(op, context)

    assert result["state"] == "COMPLETED" and result["exit_code"] == 0
    assert result["run_dir"].endswith("/train") and result["job_id"].isdigit()
    # Airflow's structured log goes to stdout: what the task log shows.
    streamed = re.findall(r"\] (line \d+) .*SlurmJobTrigger", capsys.readouterr().out)
    assert streamed == [f"line {i}" for i in range(1, 41)]
    log = slurm.read_file(result["log"]).decode()
    hparams = json.loads(log[log.index("{") : log.rindex("}") + 1])
    assert hparams == {"lr": 0.1, "note": 'it\'s "quoted" $(not run)'}
    assert context["task_state_store"].get(STATE_KEY)["job_id"] == result["job_id"]


def test_two_tasks_share_the_allocation(slurm: SlurmHook):
    op = SlurmJobOperator(
        task_id="ddp",
        program=bash('echo "rank $SLURM_PROCID of $SLURM_NTASKS"'),
        allocation={"tasks_per_node": 2},
        **FAST,
    )
    result = run_to_completion(op, make_context("ddp"))
    lines = slurm.read_file(result["log"]).decode().splitlines()
    assert sorted(line for line in lines if line.startswith("rank ")) == ["rank 0 of 2", "rank 1 of 2"]


def test_failing_exit_code_fails_with_code_and_log_tail(slurm: SlurmHook):
    op = SlurmJobOperator(task_id="bad", program=bash("echo about to fail; exit 3"), **FAST)
    with pytest.raises(AirflowException) as failure:
        run_to_completion(op, make_context("bad"))
    message = str(failure.value)
    assert "exit code 3" in message and "about to fail" in message


def test_a_completed_job_without_its_declared_outputs_fails_for_good(slurm: SlurmHook):
    """The wrapper records the outputs' sizes in its marker; a job that exits 0 without model.pt fails without
    retry, naming it, and one that writes both succeeds."""
    outputs = ("model.pt", "metrics.jsonl")
    writes_metrics = bash('echo \'{"name": "loss", "value": 1.0, "step": 1}\' >> "$PCFLOW_METRICS_FILE"')
    op = SlurmJobOperator(task_id="no-model", program=writes_metrics, outputs=outputs, **FAST)
    context = make_context("no-model")
    with pytest.raises(AirflowFailException) as failure:
        run_to_completion(op, context)
    assert "its output model.pt does not exist" in str(failure.value), str(failure.value)
    marker = json.loads(slurm.read_file(op.run_dir(context).marker))
    assert marker["outputs"]["model.pt"] == -1 and marker["outputs"]["metrics.jsonl"] > 0
    writes_both = bash('head -c 4096 /dev/zero > "$PCFLOW_RUN_DIR/model.pt"; echo "{}" > "$PCFLOW_METRICS_FILE"')
    done = run_to_completion(
        SlurmJobOperator(task_id="model", program=writes_both, outputs=outputs, **FAST), make_context("model")
    )
    assert done["outcome"] == "success"


def test_a_job_cancelled_by_someone_fails_without_retry(slurm: SlurmHook):
    op = SlurmJobOperator(task_id="cancelled", program=bash("sleep 120"), **FAST)
    context = make_context("cancelled")
    trigger = defer(op, context)
    slurm.cancel(trigger.job_id)
    with pytest.raises(AirflowFailException) as failure:
        op.execute_complete(context, first_event(trigger))
    assert "was cancelled" in str(failure.value) and "not retried" in str(failure.value), str(failure.value)


def test_a_task_failing_beside_another_is_a_failure_not_an_interruption(slurm: SlurmHook):
    """srun ends the other task when one fails and returns 143, though the batch shell had no SIGTERM: the
    marker names no signal, so the wait reports the failure instead of holding it for a requeue that will
    not come (the interruption grace, here an hour; the wait for the event is bounded well below it)."""
    op = SlurmJobOperator(
        task_id="one-fails",
        program=bash('[ "$SLURM_PROCID" = 0 ] && exit 3; exec sleep 120'),
        allocation={"tasks_per_node": 2},
        **FAST,
    )
    trigger = defer(op, make_context("one-fails"))
    _, kwargs = trigger.serialize()
    patient = type(trigger)(**{**kwargs, "policy": {**kwargs["policy"], "interruption_grace": 3600.0}})
    event = first_event(patient, timeout=600)
    assert (event["status"], event["outcome"]) == ("failed", "failed"), event
    marker = json.loads(slurm.read_file(event["run_dir"] + "/exit.json"))
    assert (marker["exit_code"], marker["signal"]) == (143, "")


def test_retry_reattaches_instead_of_resubmitting(slurm: SlurmHook):
    """Execute twice while the job runs (a retry), and once more after it finished: one job in Slurm."""
    store = MemoryStateStore()
    context = make_context("adopt", store=store)
    op = SlurmJobOperator(task_id="adopt", program=bash("sleep 3; echo done"), **FAST)
    first = defer(op, context)
    again = defer(SlurmJobOperator(task_id="adopt", program=bash("sleep 3; echo done"), **FAST), context)
    assert again.job_id == first.job_id

    # A worker that died between sbatch and saving the id: found by job name in Slurm.
    lost_store = make_context("adopt", store=MemoryStateStore(), run_id=context["run_id"])
    by_name = defer(SlurmJobOperator(task_id="adopt", program=bash("sleep 3; echo done"), **FAST), lost_store)
    assert by_name.job_id == first.job_id

    result = op.execute_complete(context, first_event(first))
    adopted = SlurmJobOperator(task_id="adopt", program=bash("sleep 3; echo done"), **FAST).execute(context)
    assert adopted["job_id"] == result["job_id"]
    assert [j.job_id for j in jobs_named(slurm, op.job_name(context))] == [result["job_id"]]


def test_failed_job_is_resubmitted_on_retry(slurm: SlurmHook):
    context = make_context("flaky")
    script = 'test -f "$PCFLOW_RUN_DIR/second-try" && exit 0; touch "$PCFLOW_RUN_DIR/second-try"; exit 1'
    op = SlurmJobOperator(task_id="flaky", program=bash(script), **FAST)
    with pytest.raises(AirflowException):
        run_to_completion(op, context)
    result = run_to_completion(SlurmJobOperator(task_id="flaky", program=bash(script), **FAST), context)
    jobs = jobs_named(slurm, op.job_name(context))
    assert [j.state for j in jobs] == [JobState.FAILED, JobState.COMPLETED]
    assert jobs[-1].job_id == result["job_id"]


def kill_while_waiting(slurm: SlurmHook, task_id: str, airflow_says: object) -> SlurmJobOperator:
    """A non-deferrable wait in a thread, killed from outside as the task runner's SIGTERM handler would,
    Airflow saying `airflow_says` of the task instance by then; returns the operator once its wait is over
    or 5 s later."""
    op = SlurmJobOperator(task_id=task_id, program=bash("sleep 120"), deferrable=False, **FAST)
    context = make_context(task_id)

    def wait() -> None:
        with contextlib.suppress(AirflowException):  # a cancelled job fails the wait
            op.execute(context)

    worker = threading.Thread(target=wait, daemon=True)
    worker.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (op.job_id and slurm.job_info(op.job_id).state is JobState.RUNNING):
        time.sleep(0.2)
    context["ti"].state = airflow_says
    op.on_kill()
    worker.join(timeout=5)
    return op


@pytest.mark.parametrize(
    "airflow_says", ["failed", "success", None], ids=["marked-failed", "marked-success", "cleared"]
)
def test_on_kill_cancels_the_job_when_a_person_stopped_the_task(slurm: SlurmHook, airflow_says, capfd):
    op = kill_while_waiting(slurm, "killme", airflow_says)
    assert slurm.job_info(op.job_id).state is JobState.CANCELLED
    assert f"Cancelling Slurm job {op.job_id}: a person stopped this task" in capfd.readouterr().out


@pytest.mark.parametrize(
    "airflow_says",
    ["running", ConnectionError("the API server is out of reach")],
    ids=["worker-shutting-down", "no-answer"],
)
def test_on_kill_leaves_the_job_running_when_the_orchestrator_went_away(slurm: SlurmHook, airflow_says, capfd):
    """Issue 28, point 2: a worker that shuts down (or loses Airflow) kills its task with the same SIGTERM
    as a person's "mark failed"; the job must survive it, for the next try to adopt."""
    op = kill_while_waiting(slurm, "survivor", airflow_says)
    try:
        assert slurm.job_info(op.job_id).state is JobState.RUNNING
        assert "keeps running: this task was killed, but not by a person" in capfd.readouterr().out
    finally:
        slurm.cancel(op.job_id)


def is_pending(hook: SlurmHook, job_id: str) -> bool:
    return hook.run(["squeue", "-h", "-j", job_id, "-o", "%T"], check=False).stdout.strip() == "PENDING"


def test_requeued_job_keeps_waiting_and_succeeds(slurm: SlurmHook):
    script = '[ "${SLURM_RESTART_COUNT:-0}" -ge 1 ] && { echo resumed; exit 0; }; echo first attempt; sleep 60'
    op = SlurmJobOperator(task_id="requeue", program=bash(script), **FAST)
    trigger = defer(op, make_context("requeue"))

    def requeue_when_running() -> None:
        watcher = SlurmHook()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and b"first attempt" not in watcher.read_file(trigger.run_dir + "/job.log"):
            time.sleep(0.2)
        watcher.requeue(trigger.job_id)
        # Slurm holds a requeued job back for a while (BeginTime); an operator can release it sooner. Not
        # within the second of the requeue: slurmd judges the first attempt's revoked credential by the
        # second, so a relaunch in that same second on the same node is killed ("Job credential revoked").
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not is_pending(watcher, trigger.job_id):
            time.sleep(0.2)
        time.sleep(2)
        watcher.run(["scontrol", "update", f"JobId={trigger.job_id}", "StartTime=now"], check=False)
        watcher.close()

    helper = threading.Thread(target=requeue_when_running)
    helper.start()
    event = first_event(trigger)
    helper.join()
    result = op.execute_complete(make_context("requeue"), event)
    assert result["restarts"] == 1
    log = slurm.read_file(result["log"]).decode()
    assert "first attempt" in log and "resumed" in log


def test_too_many_restarts_cancels(slurm: SlurmHook):
    op = SlurmJobOperator(task_id="restarts", program=bash("sleep 60"), max_restarts=0, **FAST)
    context = make_context("restarts")
    trigger = defer(op, context)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and slurm.job_info(trigger.job_id).state is not JobState.RUNNING:
        time.sleep(0.2)
    slurm.requeue(trigger.job_id)
    with pytest.raises(AirflowException, match="requeued 1 times"):
        op.execute_complete(context, first_event(trigger))
    assert slurm.job_info(trigger.job_id).state is JobState.CANCELLED


def test_pending_too_long_fails_with_the_reason_and_cancels(slurm: SlurmHook):
    op = SlurmJobOperator(
        task_id="stuck",
        program=bash("true"),
        allocation={"extra_sbatch": {"begin": "now+1hour"}},
        pending_timeout=2,
        **FAST,
    )
    context = make_context("stuck")
    trigger = defer(op, context)
    with pytest.raises(AirflowException, match=r"pending for more than 2s.*BeginTime"):
        op.execute_complete(context, first_event(trigger))
    assert slurm.job_info(trigger.job_id).state is JobState.CANCELLED


def test_hostile_values_stay_inert(slurm: SlurmHook, local_stack: LocalStack, tmp_path: Path):
    canary = local_stack.shared_root / f"pwned-{uuid.uuid4().hex}"
    hostile = [f"$(touch {canary})", f"`touch {canary}`", f"; touch {canary}", f"&& touch {canary}", "a\nb", "'\""]
    op = SlurmJobOperator(
        task_id="hostile",
        program=["printf", "[%s]\\n", *hostile],
        env={"HOSTILE": f"$(touch {canary})"},
        hyperparameters={"x": f"$(touch {canary})"},
        **FAST,
    )
    result = run_to_completion(op, make_context("hostile"))
    log = slurm.read_file(result["log"]).decode()
    for value in hostile:
        assert f"[{value}]" in log
    assert not canary.exists()


@pytest.mark.parametrize(
    "bad",
    [
        {"allocation": {"extra_sbatch": {"uid": "0"}}},
        {"allocation": {"extra_sbatch": {"account": "x\n#SBATCH --uid=0"}}},
        {"allocation": {"partition": "compute; rm -rf /"}},
        {"allocation": {"nodes": -1}},
        {"env": {"BAD NAME": "x"}},
        {"env": {"SLURM_JOB_ID": "1"}},
        {"launcher": "ssh"},
        {"python": "python3; id"},
    ],
)
def test_bad_input_is_refused_before_anything_is_submitted(bad, slurm: SlurmHook):
    context = make_context("refused")
    op = SlurmJobOperator(task_id="refused", **{"program": ["true"], **bad})
    with pytest.raises(AirflowFailException, match="Invalid Slurm job"):
        op.execute(context)
    assert slurm.find_jobs(op.job_name(context)) == []
    assert not slurm.is_dir(op.run_dir(context).root)


def test_changed_host_key_is_refused_with_a_clear_message(local_stack: LocalStack, monkeypatch):
    conn = json.loads(local_stack.env["AIRFLOW_CONN_SLURM_DEFAULT"])
    other = (local_stack.state_dir / "ssh" / "id_ed25519.pub").read_text().split()
    conn["extra"]["host_key"] = f"{other[0]} {other[1]}"
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_IMPOSTOR", json.dumps(conn))
    with pytest.raises(SlurmConnectionError, match="does not match the key pinned"):
        SlurmHook("slurm_impostor", connect_attempts=1).run(["true"])


def test_unreachable_head_node_is_a_clear_error(local_stack: LocalStack, monkeypatch):
    conn = json.loads(local_stack.env["AIRFLOW_CONN_SLURM_DEFAULT"])
    conn["port"] = 1  # nothing listens there
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_NOWHERE", json.dumps(conn))
    with pytest.raises(SlurmConnectionError, match="Cannot reach the head node"):
        SlurmHook("slurm_nowhere", connect_attempts=1).run(["true"])


def test_array_of_four_trials_runs_each_with_its_hyperparameters(slurm: SlurmHook):
    trials = [{"trial": i, "lr": 0.1 * (i + 1)} for i in range(4)]
    script = "python3 -c \"import json, os; print('hp', json.load(open(os.environ['PCFLOW_HPARAMS'])))\""
    script += '; [ "$SLURM_ARRAY_TASK_ID" != 3 ] || exit 5'
    op = SlurmArrayJobOperator(task_id="sweep", program=bash(script), trials=trials, min_success_ratio=0.75, **FAST)
    context = make_context("sweep")
    result = run_to_completion(op, context)

    assert [t["index"] for t in result["trials"]] == [0, 1, 2, 3]
    assert [t["outcome"] for t in result["trials"]] == ["success"] * 3 + ["failed"]
    assert result["trials"][3]["exit_code"] == 5
    for trial in result["trials"]:
        log = slurm.read_file(trial["log"]).decode()
        assert f"'trial': {trial['index']}" in log, log
    # One sbatch for all four; executing again (a retry) re-attaches instead of submitting a second array,
    # and its trigger reads each element's end again: the failed trial stays failed.
    same = SlurmArrayJobOperator(task_id="sweep", program=bash(script), trials=trials, min_success_ratio=0.75, **FAST)
    adopted = run_to_completion(same, context)
    assert adopted["job_id"] == result["job_id"]
    assert [(t["outcome"], t["exit_code"]) for t in adopted["trials"]] == [("success", 0)] * 3 + [("failed", 5)]
    assert {j.job_id.split("_")[0] for j in jobs_named(slurm, op.job_name(context))} == {result["job_id"]}


def test_array_below_the_success_ratio_fails_naming_the_trials(slurm: SlurmHook):
    op = SlurmArrayJobOperator(task_id="sweep-bad", program=bash("exit 2"), trials=[{}, {}], **FAST)
    with pytest.raises(AirflowException, match=r"0 of 2 elements.*exit code 2"):
        run_to_completion(op, make_context("sweep-bad"))
