"""A real job array on the local Slurm: the early-stopping check cancels a diverging trial (recorded as
stopped early), the leaderboard ranks the trials and returns the best one's hyperparameters."""

from __future__ import annotations

import importlib
import json

import pytest
from airflow.sdk.exceptions import TaskDeferred
from taskcontext import first_event, make_context

from pcflow.metrics.early_stop import EarlyStoppingOperator
from pcflow.metrics.operators import SweepLeaderboardOperator
from pcflow.slurm.operators import SlurmArrayJobOperator

pytestmark = pytest.mark.stack

# Trial "good" improves; trial "nan" diverges then would keep running for a minute.
TRIAL = r"""
mode=$(python3 -c 'import json,os; print(json.load(open(os.environ["PCFLOW_HPARAMS"]))["mode"])')
for e in 0 1 2 3; do
  v=$(awk -v e=$e 'BEGIN{print 0.2+0.1*e}')
  [ "$mode" = nan ] && [ $e -ge 2 ] && v=NaN
  printf '{"time": %s, "epoch": %d, "step": %d, "name": "acc", "value": %s, "split": "eval"}\n' \
    "$(date +%s.%N)" $e $e "$v" >> "$PCFLOW_METRICS_FILE"
  sleep 0.3
done
[ "$mode" = nan ] && sleep 60
exit 0
"""


def revive(deferred: TaskDeferred):
    classpath, kwargs = deferred.trigger.serialize()
    module, _, name = classpath.rpartition(".")
    return getattr(importlib.import_module(module), name)(**kwargs)


def test_early_stop_then_leaderboard(slurm, s3, bucket, stack_name):
    context = make_context("sweep")
    trials = [{"mode": "good"}, {"mode": "nan"}]
    train = SlurmArrayJobOperator(
        task_id="sweep",
        program=["bash", "-c", TRIAL],
        trials=trials,
        min_success_ratio=0.5,
        poll_interval=0.2,
        confirm_interval=2.0,
    )
    with pytest.raises(TaskDeferred) as deferred:
        train.execute(context)
    wait_train = revive(deferred.value)

    check = EarlyStoppingOperator(
        task_id="stop1", train_task_id="sweep", objective="acc:max", patience=3, element=1, poll_interval=0.3
    )
    with pytest.raises(TaskDeferred) as deferred:
        check.execute(make_context("stop1", run_id=context["run_id"]))
    stopped = check.execute_complete(context, first_event(revive(deferred.value)))
    assert stopped["outcome"] == "stopped_early" and stopped["decision"]["reason"] == "diverged"

    job = train.execute_complete(context, first_event(wait_train))
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
    assert outcomes == {0: "completed", 1: "stopped_early"}
    prefix = f"runs/{result['run_key']}/"
    csv_text = s3.get_object(Bucket=bucket, Key=prefix + "leaderboard.csv")["Body"].read().decode()
    assert csv_text.splitlines()[1].startswith("1,0,completed,0.5")
    page = s3.get_object(Bucket=bucket, Key=prefix + "leaderboard.html")["Body"].read().decode()
    assert page.count("<polyline") >= 2
    trial_doc = json.loads(s3.get_object(Bucket=bucket, Key=prefix + "trials/1/metrics.json")["Body"].read())
    assert trial_doc["early_stop"]["decision"]["reason"] == "diverged"
