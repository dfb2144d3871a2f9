"""The cost approval between the first task and the first stage that creates: skipped below the profile's
threshold (the stages after it still run), waiting for a person above it (Airflow's Required actions,
with the figures and a response timeout), and Reject skipping every stage right after it, so nothing is
created. The branch logic runs here on the DAG as parsed; an approval clicked in the UI needs the
real-scheduler test. About 3 s (the DAG bag)."""

from __future__ import annotations

import datetime as dt
import types

import pytest
from airflow.sdk.exceptions import AirflowSkipException, DownstreamTasksSkipped, TaskAwaitingInput
from dagrun import REPO
from taskcontext import FakeTI

COST = {
    "summary": "Cost of this run: up to $600.00 (budget $800.00): ...",
    "maximum_usd": 600.0,
    "budget_usd": 800.0,
    "approval": {"above_usd": 500.0, "needed": True, "timeout_hours": 6.0},
    "per_hour": 50.0,
    "capacity_type": "ondemand",
    "nodes": 4,
    "prices": [{"usd_per_hour": 12.5, "source": "us-east-1 price table as of 2026-11-01", "item": "g5.12xlarge"}],
    "time_limit_hours": 12.0,
    "trials": 1,
    "cluster_hours": 0.0,
    "infrastructure_per_hour": 0.0,
}


@pytest.fixture(scope="module")
def pretrain():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags")).dags["pretrain"]


def approval_of(dag, cost):
    task = dag.get_task("approve_cost")
    task.cost = cost  # what Airflow renders from the validate task's return value
    return task


def context_for(task, triggered_by: str | None = None) -> dict:
    ti = FakeTI(dag_id="pretrain", run_id="manual__2026-11-30", task_id=task.task_id)
    ti.id = "0190a8c4-0000-7000-8000-000000000000"
    dag_run = types.SimpleNamespace(run_id=ti.run_id, triggering_user_name=triggered_by)
    return {"ti": ti, "task_instance": ti, "task": task, "dag_run": dag_run}


def test_the_approval_sits_between_the_first_task_and_everything_that_creates(pretrain):
    task = pretrain.get_task("approve_cost")
    assert task.upstream_task_ids == {"validate"}
    assert task.downstream_task_ids == {"ensure_dataset_bucket", "dataset_source"}
    for name in task.downstream_task_ids:  # they run when the approval was skipped
        assert pretrain.get_task(name).trigger_rule == "none_failed_min_one_success"
    # The network after the bucket that holds the runs' references to it (pcflow.aws.network_users).
    assert pretrain.get_task("network").upstream_task_ids == {"validate", "ensure_dataset_bucket"}


def test_below_the_threshold_the_approval_is_skipped(pretrain):
    cheap = {**COST, "approval": {**COST["approval"], "needed": False}}
    task = approval_of(pretrain, cheap)
    with pytest.raises(AirflowSkipException, match=r"No approval needed: Cost of this run: up to \$600.00"):
        task.execute(context_for(task))


def test_above_the_threshold_the_run_waits_for_a_person(pretrain, monkeypatch):
    requests = []
    monkeypatch.setattr(
        "airflow.providers.standard.operators.hitl.upsert_hitl_detail", lambda **kw: requests.append(kw)
    )
    task = approval_of(pretrain, COST)
    with pytest.raises(TaskAwaitingInput) as waiting:
        task.execute(context_for(task))
    assert waiting.value.timeout == dt.timedelta(hours=6)
    (request,) = requests
    assert request["options"] == ["Approve", "Reject"]
    assert request["subject"] == "Approve up to $600.00 for manual__2026-11-30"
    assert "**This run may cost up to $600.00**, above the $500.00" in request["body"]
    assert "4 x g5.12xlarge on-demand at $12.50/h" in request["body"]


def test_reject_skips_every_stage_after_it(pretrain):
    task = approval_of(pretrain, COST)
    event = {
        "chosen_options": ["Reject"],
        "params_input": {},
        "responded_at": dt.datetime.now(dt.UTC),
        "responded_by_user": {"id": "1", "name": "approver"},
    }
    with pytest.raises(DownstreamTasksSkipped) as skipped:
        task.execute_complete(context_for(task), event)
    # The network (after the bucket, all_success) is skipped with the bucket, and everything after them.
    assert set(skipped.value.tasks) == {"ensure_dataset_bucket", "dataset_source"}
    assert pretrain.get_task("network").trigger_rule == "all_success"
    approved = task.execute_complete(context_for(task), {**event, "chosen_options": ["Approve"]})
    assert approved["chosen_options"] == ["Approve"]


ALICE, BOB = {"id": "7", "name": "alice"}, {"id": "8", "name": "bob"}


def answer(option: str, by: dict) -> dict:
    return {
        "chosen_options": [option],
        "params_input": {},
        "responded_at": dt.datetime.now(dt.UTC),
        "responded_by_user": by,
    }


@pytest.mark.security
def test_the_person_who_triggered_a_run_cannot_approve_it(pretrain):
    from pcflow.approval import SelfApproval

    task = approval_of(pretrain, COST)
    with pytest.raises(SelfApproval, match="'alice' approved the run they triggered: another person must approve"):
        task.execute_complete(context_for(task, triggered_by="alice"), answer("Approve", ALICE))
    approved = task.execute_complete(context_for(task, triggered_by="alice"), answer("Approve", BOB))
    assert approved["responded_by_user"] == BOB  # recorded in the run: the task's XCom
    with pytest.raises(DownstreamTasksSkipped):  # rejecting one's own run is fine
        task.execute_complete(context_for(task, triggered_by="alice"), answer("Reject", ALICE))


@pytest.mark.security
def test_only_the_profiles_other_approvers_may_answer(pretrain, monkeypatch):
    from pcflow.approval import SelfApproval

    requests = []
    monkeypatch.setattr(
        "airflow.providers.standard.operators.hitl.upsert_hitl_detail", lambda **kw: requests.append(kw)
    )
    listed = {**COST, "approval": {**COST["approval"], "approvers": [ALICE, BOB]}}
    task = approval_of(pretrain, listed)
    with pytest.raises(TaskAwaitingInput):
        task.execute(context_for(task, triggered_by="alice"))
    assert requests[-1]["assigned_users"] == [BOB]
    alone = {**COST, "approval": {**COST["approval"], "approvers": [ALICE]}}
    task = approval_of(pretrain, alone)
    with pytest.raises(SelfApproval, match="the profile's only approver is 'alice', who triggered this run"):
        task.execute(context_for(task, triggered_by="alice"))
