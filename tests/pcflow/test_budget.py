"""What a run may cost, known and capped before spend: the first task prices the run (compute nodes x type,
spot from EC2's spot price history, head node, FSx), computes its maximum (x time limit, x trials, plus
the cluster's create and delete time), logs it in one line and returns it; a run above its budget, one
that cannot be priced while it has a budget, and a bad budget are refused with what to change. Figures
are checked against hand-computed ones. Offline (the validate task's function, as conftest.py's `offline`
runs it) except the spot price, read from the moto server's history: about 5 s, plus the stack when it is
not up."""

from __future__ import annotations

import pytest
from airflow.sdk.exceptions import AirflowFailException
from run_factories import make_planned_run

from pcflow.budget import plan_cost

pytestmark = pytest.mark.security

#: pcflow/prices.json, us-east-1, as of 2026-11-01 (what the hand computations use).
C5_2XLARGE, G5_12XLARGE = 0.34, 5.672
FSX_1200_SCRATCH_2 = 1200 * 0.14 / 730  # USD per hour: GiB x per GiB-month / hours in a month


def refusal(validate, conf: dict, **kwargs) -> str:
    with pytest.raises(AirflowFailException) as refused:
        validate(conf, **kwargs)
    return str(refused.value)


def test_on_demand_estimate_is_logged_returned_and_matches_the_hand_computed_one(offline, admin_profiles, caplog):
    """The maximum counts every attempt Slurm may make: the first and `training.max_restarts` (3 by
    default) requeues, each up to the time limit."""
    run = offline({"instance_type": "c5.2xlarge", "nodes": 3, "budget_usd": 10})
    cost = run["cost"]
    assert cost["per_hour"] == pytest.approx(3 * C5_2XLARGE)
    assert cost["time_limit_hours"] == 0.5 and cost["trials"] == 1 and cost["cluster_hours"] == 0  # static
    assert run["training"]["max_restarts"] == 3 and cost["attempts"] == 4
    assert cost["maximum_usd"] == pytest.approx(3 * C5_2XLARGE * 0.5 * 4)  # $2.04
    assert cost["budget_usd"] == 10 and cost["approval"]["needed"] is False
    line = "Cost of this run: up to $2.04 (budget $10.00): $1.02/h (3 x c5.2xlarge on-demand at $0.34/h)"
    assert cost["summary"].startswith(line) and line in caplog.text
    assert "x 0.5 h time limit x 4 attempts (up to 3 requeues)" in cost["summary"]
    assert cost["price_sources"] == ["table"]  # offline: no Price List API
    assert cost["summary"].endswith("prices: table (us-east-1 price table as of 2026-11-01)")
    never_requeued = admin_profiles.make("local", {"training": {"max_restarts": 0}})
    once = offline({"profile": never_requeued, "instance_type": "c5.2xlarge", "nodes": 3})["cost"]
    assert once["attempts"] == 1 and once["maximum_usd"] == pytest.approx(3 * C5_2XLARGE * 0.5)  # $0.51
    assert "attempts" not in once["summary"]


def test_a_sweep_costs_its_trials(offline):
    conf = {"instance_type": "c5.2xlarge", "nodes": 3, "trials": [{"seed": 0}], "grid": {"lr": [0.1, 0.2, 0.3]}}
    cost = offline({**conf, "budget_usd": 10}, sweep=True)["cost"]
    assert cost["trials"] == 3 and cost["maximum_usd"] == pytest.approx(3 * 3 * C5_2XLARGE * 0.5 * 4)  # $6.12
    assert "x 0.5 h time limit x 3 trials x 4 attempts (up to 3 requeues)" in cost["summary"]


def aws_gpu_cost(ec2=None, trials: list[dict] | None = None, **settings) -> dict:
    """The aws-gpu profile's run priced as the first task prices it (the checks that ask AWS aside); with
    `trials`, as a sweep (the document's expanded trials), one trial at a time."""
    sweep = {"sweep": {"max_parallel": 1}} if trials else {}
    return plan_cost(make_planned_run("aws-gpu", trials=trials, **sweep, **settings), ec2=ec2).cost


def test_parallelcluster_adds_head_node_and_fsx_over_the_time_limit_and_the_cluster_life():
    cost = aws_gpu_cost(capacity_type="ondemand")  # 2 x g5.12xlarge, c5.2xlarge head, 1200 GiB SCRATCH_2
    infra = C5_2XLARGE + FSX_1200_SCRATCH_2
    assert cost["infrastructure_per_hour"] == pytest.approx(infra)
    assert cost["per_hour"] == pytest.approx(2 * G5_12XLARGE + infra)
    # 12 h time limit x 6 attempts (max_restarts 5), plus 40 + 20 minutes of create and delete at the head
    # node and FSx's price
    assert cost["attempts"] == 6
    assert cost["maximum_usd"] == pytest.approx((2 * G5_12XLARGE + infra) * 12 * 6 + infra * 1.0, abs=1e-4)  # $858.39
    assert cost["summary"].startswith("Cost of this run: up to $858.39 (budget $1,000.00)")
    assert "+ $0.57/h x 1 h while the cluster is created and deleted" in cost["summary"]


@pytest.mark.stack
def test_spot_is_priced_from_ec2s_spot_price_history(local_stack):
    """moto's history: 0.00001 USD per hour for every offered type in every zone of the region."""
    from pcflow.aws.clients import aws_client

    alone = {"instance_types": [], "fallback": []}  # the run's own type and spot capacity only: no fallback
    cost = aws_gpu_cost(ec2=aws_client("ec2"), capacity=alone)  # the profile's spot capacity
    infra = C5_2XLARGE + FSX_1200_SCRATCH_2
    assert cost["compute_per_node_hour"] == pytest.approx(0.00001)
    assert cost["maximum_usd"] == pytest.approx((2 * 0.00001 + infra) * 12 * 6 + infra, abs=1e-4)  # $41.62
    assert "EC2 spot price history" in cost["summary"] and "2 x g5.12xlarge spot at $1e-05/h" in cost["summary"]
    # A sweep of 4 trials on spot: each trial's nodes, head node and FSx over the time limit; the cluster's
    # create and delete once.
    sweep = aws_gpu_cost(ec2=aws_client("ec2"), trials=[{"lr": lr} for lr in (0.1, 0.2, 0.3, 0.4)], capacity=alone)
    assert sweep["trials"] == 4 and sweep["compute_per_node_hour"] == pytest.approx(0.00001)
    assert sweep["maximum_usd"] == pytest.approx((2 * 0.00001 + infra) * 12 * 6 * 4 + infra, abs=1e-4)  # $164.78
    assert sweep["summary"].startswith("Cost of this run: up to $164.78 (budget $1,000.00)")
    assert "x 12 h time limit x 4 trials x 6 attempts (up to 5 requeues)" in sweep["summary"]


def test_spot_without_history_is_bounded_by_the_on_demand_price():
    cost = aws_gpu_cost(ec2=None)
    assert cost["compute_per_node_hour"] == G5_12XLARGE
    assert "on-demand, no spot price history" in cost["summary"]


def test_over_budget_is_refused_with_both_figures_and_what_to_change(offline):
    message = refusal(offline, {"instance_type": "g5.12xlarge", "nodes": 3})  # the profile's budget: $5
    assert message.startswith("budget.usd: this run may cost up to $34.03, more than its budget of $5.00: ")
    assert "3 x g5.12xlarge on-demand at $5.67/h" in message and "fewer nodes (now 3)" in message
    assert "fewer requeues (training.max_restarts, now 3; the admin's)" in message
    assert "prices: table (us-east-1 price table as of 2026-11-01)" in message
    assert "raise the budget (form field 'Budget (USD)', up to $50.00, the profile's budget.max_usd)" in message
    assert offline({"instance_type": "g5.12xlarge", "nodes": 3, "budget_usd": 35})["cost"]["maximum_usd"] < 35


@pytest.mark.parametrize(
    ("budget", "complaint"),
    [
        (0, "budget.usd: Value error, 0 is not an amount a run can spend: it must be a number above 0"),
        (-5, "budget.usd: Value error, -5 is not an amount a run can spend"),
        ("abc", "budget.usd: Value error, must be an amount of US dollars (a number above 0), got 'abc'"),
        ("12", "must be an amount of US dollars (a number above 0), got '12'"),
        (True, "got True"),
        (float("nan"), "nan is not an amount a run can spend"),
        (1e12, "budget.usd: Value error, 1e+12 USD is more than any run costs (1e+06 at most): check the number"),
        (51, "51 USD is above the profile's hard maximum of 50 USD (budget.max_usd, the deployment admin's)"),
    ],
)
def test_bad_budgets_are_refused(offline, budget, complaint):
    assert complaint in refusal(offline, {"budget_usd": budget})


def test_the_budget_is_a_trigger_users_only_where_the_profile_says(offline, admin_profiles):
    profile = admin_profiles.make("local", {"overridable": {"budget.usd": {"max": 8}}})
    assert "budget.usd (form field 'budget_usd'): 9 is outside what the profile allows (at most 8)" in refusal(
        offline, {"profile": profile, "budget_usd": 9}
    )
    locked = admin_profiles.make("local", name="locked")
    document = (admin_profiles.directory / "locked.yaml").read_text().replace("  budget.usd: {}\n", "")
    (admin_profiles.directory / "locked.yaml").write_text(document)
    assert "budget.usd (form field 'budget_usd'): only the deployment admin may change this" in refusal(
        offline, {"profile": locked, "budget_usd": 1}
    )


def test_a_region_without_prices_says_so_instead_of_using_another_regions(offline, admin_profiles):
    profile = admin_profiles.make("local", {"region": "eu-west-1"})
    message = refusal(offline, {"profile": profile})
    assert "budget.usd: this run has a budget of $5.00, but it cannot be priced" in message
    assert "no prices for region eu-west-1 (it has us-east-1)" in message
    unbudgeted = admin_profiles.make("local", {"region": "eu-west-1", "budget": {"usd": None, "max_usd": None}})
    cost = offline({"profile": unbudgeted})["cost"]
    assert cost["maximum_usd"] is None and cost["summary"].startswith("Cost of this run: unknown (no budget)")


def test_an_unknown_price_cannot_be_capped(offline, admin_profiles):
    profile = admin_profiles.make("local", {"instance_type": "m7i.xlarge"})
    message = refusal(offline, {"profile": profile})
    assert "no price for m7i.xlarge (not in the us-east-1 price table). An unknown price cannot be capped" in message
    unbudgeted = admin_profiles.make("local", {"instance_type": "m7i.xlarge", "budget": {"usd": None, "max_usd": None}})
    assert offline({"profile": unbudgeted})["cost"]["unknown"] == ["m7i.xlarge (not in the us-east-1 price table)"]


def test_no_time_limit_leaves_nothing_to_bound_a_budget(offline, admin_profiles):
    profile = admin_profiles.make("local", {"training": {"time_limit": None}})
    assert refusal(offline, {"profile": profile}).startswith("training.time_limit: not set, so nothing bounds")


def test_a_profile_may_let_a_run_start_capped_instead(offline, admin_profiles):
    profile = admin_profiles.make("local", {"budget": {"usd": 0.05, "if_maximum_exceeds": "cap"}})
    cost = offline({"profile": profile, "instance_type": "g5.12xlarge"})["cost"]
    assert cost["maximum_usd"] > cost["budget_usd"] == 0.05


def test_above_the_approval_threshold_the_run_asks_for_approval(offline, admin_profiles):
    profile = admin_profiles.make("local", {"budget": {"approval_above_usd": 8}})
    costly = offline({"profile": profile, "instance_type": "g5.12xlarge", "nodes": 3, "budget_usd": 50})["cost"]
    assert costly["maximum_usd"] == pytest.approx(3 * G5_12XLARGE * 0.5 * 4)  # $34.03, above $8
    assert costly["approval"] == {"above_usd": 8.0, "needed": True, "timeout_hours": 24.0, "approvers": []}
    assert offline({"profile": profile})["cost"]["approval"]["needed"] is False
