"""A real job array on the local Slurm: the early-stopping check cancels a diverging trial and a stalled
one (recorded as stopped early, not as failures: the array succeeds although every trial must), the
leaderboard ranks the trials and returns the best one's hyperparameters."""

from __future__ import annotations

import importlib
import json
import re

import pytest
from airflow.sdk.exceptions import TaskDeferred
from taskcontext import first_event, make_context

from pcflow.metrics.early_stop import EarlyStoppingOperator
from pcflow.metrics.operators import SweepLeaderboardOperator
from pcflow.slurm.operators import SlurmArrayJobOperator, SlurmJobOperator

pytestmark = pytest.mark.stack

# Trial "good" improves; trial "nan" diverges and "flat" stalls, then both would keep running for a minute.
TRIAL = r"""
mode=$(python3 -c 'import json,os; print(json.load(open(os.environ["PCFLOW_HPARAMS"]))["mode"])')
for e in 0 1 2 3; do
  v=$(awk -v e=$e 'BEGIN{print 0.2+0.1*e}')
  [ "$mode" = nan ] && [ $e -ge 2 ] && v=NaN
  [ "$mode" = flat ] && v=0.25
  printf '{"time": %s, "epoch": %d, "step": %d, "name": "acc", "value": %s, "split": "eval"}\n' \
    "$(date +%s.%N)" $e $e "$v" >> "$PCFLOW_METRICS_FILE"
  sleep 0.3
done
[ "$mode" != good ] && exec sleep 60  # exec: the task itself, so scancel's TERM reaches it
exit 0
"""


def revive(deferred: TaskDeferred):
    classpath, kwargs = deferred.trigger.serialize()
    module, _, name = classpath.rpartition(".")
    return getattr(importlib.import_module(module), name)(**kwargs)


def test_early_stop_then_leaderboard(slurm, s3, bucket, stack_name):
    context = make_context("sweep")
    trials = [{"mode": "good"}, {"mode": "nan"}, {"mode": "flat"}]
    train = SlurmArrayJobOperator(
        task_id="sweep",
        program=["bash", "-c", TRIAL],
        trials=trials,
        min_success_ratio=1.0,
        poll_interval=0.2,
        confirm_interval=2.0,
    )
    with pytest.raises(TaskDeferred) as deferred:
        train.execute(context)
    wait_train = revive(deferred.value)

    for element, reason in ((1, "diverged"), (2, "no_improvement")):
        check = EarlyStoppingOperator(
            task_id=f"stop{element}",
            train_task_id="sweep",
            objective="acc:max",
            patience=2,
            element=element,
            poll_interval=0.3,
        )
        with pytest.raises(TaskDeferred) as deferred:
            check.execute(make_context(check.task_id, run_id=context["run_id"]))
        stopped = check.execute_complete(context, first_event(revive(deferred.value)))
        assert stopped["outcome"] == "stopped_early" and stopped["decision"]["reason"] == reason

    job = train.execute_complete(context, first_event(wait_train))  # raises if a trial counted as failed
    assert [t["outcome"] for t in job["trials"]] == ["success", "stopped_early", "stopped_early"]
    board = SweepLeaderboardOperator(
        task_id="leaderboard",
        job=job,
        bucket=bucket,
        stack=stack_name,
        objective={"name": "acc", "mode": "max"},
        cloudwatch=False,
    )
    result = board.execute(make_context("leaderboard", run_id=context["run_id"]))
    assert result["best"]["trial"] == 0 and result["best"]["hyperparameters"] == {"mode": "good"}
    assert result["best"]["value"] == pytest.approx(0.5)
    outcomes = {r["trial"]: r["outcome"] for r in result["leaderboard"]}
    assert outcomes == {0: "completed", 1: "stopped_early", 2: "stopped_early"}
    prefix = f"runs/{result['run_key']}/"
    csv_text = s3.get_object(Bucket=bucket, Key=prefix + "leaderboard.csv")["Body"].read().decode()
    assert csv_text.splitlines()[1].startswith("1,0,completed,0.5")
    page = s3.get_object(Bucket=bucket, Key=prefix + "leaderboard.html")["Body"].read().decode()
    overlaid = set(re.findall(r'<polyline class="series" data-name="(trial \d)" points="[^"]+ [^"]+"', page))
    assert overlaid == {"trial 0", "trial 1", "trial 2"}  # every trial's curve, with at least two points
    best = page.split("<div id='best'>")[1].split("</div>")[0]
    assert "Trial 0 (completed)" in best and "&quot;mode&quot;: &quot;good&quot;" in best
    trial_doc = json.loads(s3.get_object(Bucket=bucket, Key=prefix + "trials/1/metrics.json")["Body"].read())
    assert trial_doc["early_stop"]["decision"]["reason"] == "diverged"


STOP_RULE = {"objective": {"name": "acc", "mode": "max"}, "patience": 2, "min_delta": 0.0}


def run_with_stop_rule(operator, task_id: str, **kwargs) -> tuple[dict, object, dict]:
    """The pipeline's way: the rule travels with the train task, no check task waits beside it.
    Returns the task's result, the operator and the run's context."""
    context = make_context(task_id)
    train = operator(
        task_id=task_id,
        program=["bash", "-c", TRIAL],
        poll_interval=0.2,
        confirm_interval=1.0,
        early_stopping=STOP_RULE,
        **kwargs,
    )
    with pytest.raises(TaskDeferred) as deferred:
        train.execute(context)
    return train.execute_complete(context, first_event(revive(deferred.value))), train, context


def first_metric_time(slurm, trial: dict) -> float:
    return json.loads(slurm.read_file(trial["run_dir"] + "/metrics.jsonl").splitlines()[0])["time"]


def test_the_train_task_stops_trials_early_while_it_waits(slurm, s3, bucket, stack_name):
    """Three trials side by side (the array's `%3`), each on a node of its own: the rule stops the two bad
    ones while they overlap, and the leaderboard reads every trial's own metrics (issue 27)."""
    trials = [{"mode": "good"}, {"mode": "nan"}, {"mode": "flat"}]
    job, train, context = run_with_stop_rule(
        SlurmArrayJobOperator, "sweep-stop", trials=trials, max_parallel=3, min_success_ratio=1.0
    )
    assert [t["outcome"] for t in job["trials"]] == ["success", "stopped_early", "stopped_early"]
    records = [json.loads(slurm.read_file(t["run_dir"] + "/early_stop.json")) for t in job["trials"][1:]]
    assert [r["decision"]["reason"] for r in records] == ["diverged", "no_improvement"]
    assert [r["job_id"] for r in records] == [f"{job['job_id']}_1", f"{job['job_id']}_2"]
    assert slurm.read_file(job["trials"][0]["run_dir"] + "/early_stop.json") == b""
    # They overlapped: each stopped trial had started before the other was stopped (one at a time, the second
    # would start only after the first had ended), and on nodes of their own (--exclusive).
    (started_1, started_2), (stopped_1, stopped_2) = (
        [first_metric_time(slurm, t) for t in job["trials"][1:]],
        [r["time"] for r in records],
    )
    assert started_1 < stopped_2 and started_2 < stopped_1
    markers = [json.loads(slurm.read_file(t["run_dir"] + "/exit.json")) for t in job["trials"]]
    assert len({m["nodes"] for m in markers}) == 3, markers
    board = SweepLeaderboardOperator(
        task_id="leaderboard",
        job=job,
        bucket=bucket,
        stack=stack_name,
        objective=STOP_RULE["objective"],
        cloudwatch=False,
    )
    result = board.execute(make_context("leaderboard", run_id=context["run_id"]))
    assert {r["trial"]: r["outcome"] for r in result["leaderboard"]} == {
        0: "completed",
        1: "stopped_early",
        2: "stopped_early",
    }
    assert result["best"]["trial"] == 0 and result["best"]["value"] == pytest.approx(0.5)
    # A retry of the task (a worker lost after the job ended) re-attaches to the array instead of training
    # again, and its trigger reads each trial's end anew: the stopped trials stay stopped.
    retry_context = make_context("sweep-stop", run_id=context["run_id"])
    with pytest.raises(TaskDeferred) as reattached:
        train.execute(retry_context)
    retry = train.execute_complete(retry_context, first_event(revive(reattached.value)))
    assert retry["job_id"] == job["job_id"]
    assert [t["outcome"] for t in retry["trials"]] == ["success", "stopped_early", "stopped_early"]


def test_a_single_job_stopped_early_says_so(slurm):
    result, train, context = run_with_stop_rule(SlurmJobOperator, "single-stop", hyperparameters={"mode": "flat"})
    assert result["outcome"] == "stopped_early" and result["state"] != "COMPLETED"
    retry = train.execute(make_context("single-stop", run_id=context["run_id"]))  # adopts, does not resubmit
    assert (retry["job_id"], retry["outcome"]) == (result["job_id"], "stopped_early")
    assert json.loads(slurm.read_file(result["run_dir"] + "/early_stop.json"))["decision"]["reason"] == "no_improvement"


# pcflow's check wrote its record, then the program died of the SIGTERM before the batch shell heard of
# it (Slurm signals the two in no set order, and a shell whose program ended first never hears of it).
DIES_BEFORE_ITS_SHELL = r"""
printf '{"job_id": "%s"}\n' "$SLURM_JOB_ID" > "$PCFLOW_RUN_DIR/early_stop.json"
kill -TERM $$
"""


def test_a_program_killed_before_its_shell_heard_of_it_was_still_stopped_early(slurm):
    context = make_context("dies-first")
    train = SlurmJobOperator(
        task_id="dies-first", program=["bash", "-c", DIES_BEFORE_ITS_SHELL], poll_interval=0.2, confirm_interval=1.0
    )
    with pytest.raises(TaskDeferred) as deferred:
        train.execute(context)
    result = train.execute_complete(context, first_event(revive(deferred.value)))
    assert result["outcome"] == "stopped_early"
    marker = json.loads(slurm.read_file(result["run_dir"] + "/exit.json"))
    assert (marker["exit_code"], marker["signal"]) == (143, "early_stop")
