"""During the run: `pretrain` on the local stack with a budget its job outruns (the admin's profile lets
such a run start capped: `budget.if_maximum_exceeds: cap`). The train task's wait logs the cost so far at
its cadence, cancels the job within one poll of the moment the cost so far reaches the budget (recorded
in budget_exhausted.json), the run's teardowns leave nothing tagged with it, and the harvest and report
say `budget_exhausted`, a decision like early stopping, not a failure. One DAG run: 70-105 s."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import boto3
import pytest
from dagrun import remove_stack, run_dag, tagged_resources

pytestmark = pytest.mark.stack
RATE = 5.672 / 3600  # one g5.12xlarge node, USD per second (us-east-1 table as of 2026-11-01)
BUDGET = 0.03  # about 19 s of the node: the job trains far longer
POLL_S = 1.0  # the train task's poll_interval
KILL_WAIT_S = 5  # the local slurm.conf's KillWait: the most a cancelled job lives on after its SIGTERM


@pytest.mark.usefixtures("airflow")
def test_a_job_that_reaches_its_budget_is_cancelled_and_the_run_says_so(admin_profiles, capfd):
    stack = f"bud{uuid.uuid4().hex[:8]}"
    profile = admin_profiles.make(
        "local",
        {
            "stack": stack,
            "dataset": {"bucket": f"pcflow-{stack}-data"},
            "budget": {"usd": BUDGET, "if_maximum_exceeds": "cap", "report_every_s": 5},
        },
    )
    conf = {
        "profile": profile,
        "partition": "budget",
        "instance_type": "g5.12xlarge",
        "nodes": 1,
        "hyperparameters": {"epochs": 200},
    }
    try:
        result = run_dag("pretrain", conf)
        log = "".join(capfd.readouterr())
        if result.state != "success":
            print(log)  # what the tasks said, in pytest's report
        assert result.state == "success", result.task_states
        train = result.returned["train"]
        assert train["outcome"] == "budget_exhausted" and train["state"].startswith("CANCELLED")
        assert "Cost so far: $" in log and "of the $0.03 budget" in log  # the wait's cadence

        spent = json.loads((Path(train["run_dir"]) / "budget_exhausted.json").read_text())
        assert spent["job_id"] == train["job_id"] and spent["budget_usd"] == BUDGET
        assert BUDGET <= spent["cost_usd"] <= BUDGET + RATE * POLL_S * 3  # one poll, with slack for a busy host
        assert spent["node_seconds"] == pytest.approx(BUDGET / RATE, abs=POLL_S * 3)
        # Slurm's own account: the job ran as long as the budget pays for, and ended at the cancel.
        assert BUDGET / RATE - 1 <= train["elapsed_s"] <= BUDGET / RATE + POLL_S * 3 + KILL_WAIT_S

        assert result.returned["metrics"]["outcome"] == "budget_exhausted"
        report = result.returned["metrics"]["report"].removeprefix("s3://").split("/", 1)
        html = boto3.client("s3").get_object(Bucket=report[0], Key=report[1])["Body"].read().decode()
        assert "outcome <b>budget_exhausted</b>" in html and 'id="budget-exhausted"' in html
        assert result.task_states["delete_cluster"] == result.task_states["teardown"] == "success"
        assert tagged_resources("pcflow:run", result.run_key) == []
    finally:
        assert remove_stack(stack) == []
