"""A sweep's trials side by side (issue 27): `sweep.max_parallel` (the profile's, a trigger user's within
its bounds) decides how many trials run at once; the first task settles it (`sweep.parallel`: no more than
the trials, within an admin's `max_count`), and the array's `%` throttle, ParallelCluster's MaxCount
(training.nodes x trials at once) and the cost's count of the head node and FSx all follow from it. Each
element allocates its nodes whole. Unit level: the validate task's function offline, on local and on the
aws-gpu rehearsal (the real local Slurm runs overlapping trials in tests/pcflow/metrics/test_sweep_e2e.py)."""

from __future__ import annotations

import pytest
import yaml
from airflow.sdk.exceptions import AirflowFailException
from run_factories import make_planned_run

from pcflow.budget import CostMeter, plan_cost
from pcflow.cluster.config import render_config
from pcflow.cluster.spec import ClusterSpec
from pcflow.pipeline.settings import settings_for_cluster
from pcflow.slurm.operators import SlurmArrayJobOperator
from pcflow.slurm.render import render_batch_script
from pcflow.slurm.spec import RunDir

SIX = [{"seed": seed} for seed in range(6)]
NETWORK = {
    "head_subnet_id": "subnet-0a1b2c3d4e5f60718",
    "compute_subnet_ids": ["subnet-0a1b2c3d4e5f60718"],
    "head_security_group_id": "sg-0123456789abcdef0",
}


def test_local_runs_three_trials_at_once_and_a_trigger_user_may_lower_it(offline):
    run = offline({"nodes": 1, "trials": SIX}, sweep=True)
    assert (run["sweep"]["max_parallel"], run["sweep"]["parallel"]) == (3, 3)
    one_at_a_time = offline({"nodes": 1, "trials": SIX, "trials_at_once": 1}, sweep=True)  # the form's field
    assert one_at_a_time["sweep"]["parallel"] == 1
    overridden = offline({"trials": SIX, "overrides": {"sweep": {"max_parallel": 2}}}, sweep=True)
    assert overridden["sweep"]["parallel"] == 2
    assert offline({"trials": SIX[:2]}, sweep=True)["sweep"]["parallel"] == 2  # no more than there are trials
    assert offline({})["sweep"]["parallel"] == 1  # a run that is no sweep


def test_more_trials_at_once_than_the_profile_allows_is_refused_naming_the_setting(offline):
    with pytest.raises(AirflowFailException) as refused:
        offline({"trials": SIX, "trials_at_once": 4}, sweep=True)
    assert "sweep.max_parallel (form field 'trials_at_once'): 4 is outside what the profile allows (1 to 3)" in str(
        refused.value
    )


def sweep_run(profile: str, trials: list[dict], **settings):
    """The aws-gpu run of a sweep as the first task plans it (the checks that ask AWS aside)."""
    return make_planned_run(profile, trials=trials, network={"ssh_ingress_cidrs": ["203.0.113.0/24"]}, **settings)


def max_count(run) -> int:
    spec = ClusterSpec.parse(settings_for_cluster(run, NETWORK, "ami-0123456789abcdef0"))
    config = yaml.safe_load(render_config(spec).text)
    return config["Scheduling"]["SlurmQueues"][0]["ComputeResources"][0]["MaxCount"]


@pytest.mark.parametrize("profile", ["aws-gpu", "aws-gpu-rehearsal"])
def test_the_queue_holds_every_trial_that_runs_at_once(profile):
    run = sweep_run(profile, SIX)  # 2 nodes a trial, 2 trials at once (the profile's)
    assert run.sweep.parallel == 2 and max_count(run) == 4
    assert max_count(sweep_run(profile, SIX, sweep={"max_parallel": 4})) == 8
    assert max_count(sweep_run(profile, SIX[:1], sweep={"max_parallel": 4})) == 2  # one trial: one trial's nodes
    single = sweep_run(profile, [])  # no sweep
    assert single.sweep.parallel == 1 and max_count(single) == 2


def test_an_admins_max_count_bounds_the_trials_at_once(admin_profiles):
    profile = admin_profiles.make("aws-gpu-rehearsal", {"cluster": {"config": {"max_count": 7}}})
    run = sweep_run(profile, SIX, sweep={"max_parallel": 4})
    assert run.sweep.parallel == 3 and max_count(run) == 7  # 3 trials of 2 nodes fit in 7


def test_the_maximum_counts_every_trials_nodes_and_the_head_node_per_wave():
    """6 trials, 2 at once: 6 x 2 nodes over the time limit and its attempts, the head node and FSx over 3
    trial-lengths (not 6). One at a time gives back the serial count, never less."""
    parallel = plan_cost(sweep_run("aws-gpu", SIX, capacity_type="ondemand")).cost
    serial = plan_cost(sweep_run("aws-gpu", SIX, capacity_type="ondemand", sweep={"max_parallel": 1})).cost
    longest = 12 * 6  # time limit x attempts
    compute = parallel["compute_per_node_hour"] * 2 * longest * 6
    infra = parallel["infrastructure_per_hour"]
    assert parallel["trials_at_once"] == 2
    assert parallel["maximum_usd"] == pytest.approx(compute + infra * (longest * 3 + 1), abs=1e-3)
    assert serial["maximum_usd"] == pytest.approx(compute + infra * (longest * 6 + 1), abs=1e-3)
    assert (
        "x 6 trials x 6 attempts (up to 5 requeues), 2 trials at once (the head node and FSx for 3 of the 6"
        in (parallel["summary"])
    )
    assert "at once" not in serial["summary"]
    # 5 trials, 2 at once: 3 waves (the last trial alone).
    five = plan_cost(sweep_run("aws-gpu", SIX[:5], capacity_type="ondemand")).cost
    assert five["maximum_usd"] == pytest.approx(compute * 5 / 6 + infra * (longest * 3 + 1), abs=1e-3)


def test_the_budget_cap_asks_slurm_as_soon_as_the_throttled_trials_could_spend_it():
    cost = {"compute_per_node_hour": 3.6, "nodes": 2, "infrastructure_per_hour": 0.0, "budget_usd": 1.0}
    meters = [CostMeter(cost, 0.0, jobs=6), CostMeter(cost, 0.0, jobs=6, at_most=2)]
    for meter in meters:
        meter.observe([], 0.0)
    # 6 elements at once spend $43.20 an hour, 2 at once $14.40: the budget lasts three times longer.
    assert [meter.ask_within(0.0) for meter in meters] == [pytest.approx(1 / 0.012), pytest.approx(3 / 0.012)]


def test_each_trial_allocates_its_nodes_whole_and_the_array_is_throttled():
    train = SlurmArrayJobOperator(
        task_id="train", program=["train.py"], trials=SIX, max_parallel=3, allocation={"nodes": 1}
    )
    spec = train.job_spec()
    script = render_batch_script(spec, RunDir("/fsx/pcflow/runs/k/train"), job_name="k.train", run_key="k")
    assert "#SBATCH --array=0-5%3" in script.splitlines() and "#SBATCH --exclusive" in script.splitlines()
    shared = SlurmArrayJobOperator(task_id="t", program=["x"], trials=SIX, exclusive=False, allocation={"nodes": 1})
    assert not shared.job_spec().resources.exclusive and shared.job_spec().array.max_parallel is None
