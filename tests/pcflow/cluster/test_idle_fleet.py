"""Nothing idle billing: a kept cluster (no run tag: the nightly's) whose Slurm queue has been idle longer
than its profile's `budget.idle_minutes` has its compute fleet stopped by the janitor's task, and the next
run's cluster stage starts it again before submitting. The cluster is the pcluster STAND-IN's (its fleet
status in pcluster's DynamoDB table on moto); the queue asked is the local stack's real Slurm, over SSH
(the stand-in's head node has a moto address: until the rehearsal's stand-in answers with the local head
node, the test points the janitor at `slurm_default`). 25-45 s."""

from __future__ import annotations

import pytest

from pcflow.cluster.idle import StopIdleFleetsOperator
from pcflow.cluster.providers import delete_cluster, ensure_cluster, make_provider
from pcflow.slurm.hook import SlurmHook

pytestmark = pytest.mark.stack


class _DagRun:
    def __init__(self, run_type: str):
        self.run_type = run_type


def janitor_task(cli, profile: str, dry_run: bool | None = False) -> StopIdleFleetsOperator:
    task = StopIdleFleetsOperator(
        task_id="stop_idle_fleets", pcluster_path=str(cli), profiles=[profile], dry_run=dry_run
    )
    task.slurm_for = lambda settings: lambda described: SlurmHook(settings.ssh_conn_id)
    return task


def check(task, run_type: str = "scheduled") -> dict:
    (result,) = task.execute({"dag_run": _DagRun(run_type)})["clusters"]
    return result


def test_an_idle_kept_clusters_fleet_is_stopped_and_the_next_run_starts_it(
    standin_cli, site, admin_profiles, local_stack
):
    provider = make_provider("parallelcluster", pcluster_path=str(standin_cli))
    provider.require_host_key = False  # moto's console output has no host keys (the rehearsal's has)
    spec = site.spec()

    def profile(idle_minutes: float) -> str:
        settings = {
            "stack": site.stack,
            "budget": {"idle_minutes": idle_minutes},
            "cluster": {"ssh_conn_id": "slurm_default"},
        }
        return admin_profiles.make("aws-gpu", settings)

    patient, eager = profile(60), profile(0.05)  # an hour; three seconds
    slurm = SlurmHook("slurm_default")
    try:
        ensure_cluster(provider, spec, stack=site.stack, waiter_delay=1, waiter_max_attempts=10)  # kept: no run
        assert provider.hook.describe_compute_fleet(spec["name"])["status"] == "RUNNING"

        job = slurm.run(["sbatch", "--parsable", "-o", "/dev/null", "--wrap", "sleep 300"]).stdout.strip()
        busy = check(janitor_task(standin_cli, eager))
        assert busy["action"] == "none (jobs queued)" and busy["jobs"] >= 1
        slurm.cancel(job)
        while (info := slurm.job_info(job)) is not None and info.state.is_active:
            slurm.run(["sleep", "1"])
        assert check(janitor_task(standin_cli, patient))["action"] == "none (idle 0 min)"
        slurm.run(["sleep", "4"])  # idle longer than the eager profile's three seconds

        would = check(janitor_task(standin_cli, eager, dry_run=None), run_type="manual")  # by hand: reports only
        assert would["action"].startswith("would stop (queue idle") and would["fleet"] == "RUNNING"
        stopped = check(janitor_task(standin_cli, eager))
        assert stopped["action"].startswith("stopped (queue idle") and stopped["fleet"] == "STOP_REQUESTED"
        assert provider.hook.describe_compute_fleet(spec["name"])["status"] == "STOPPED"
        assert check(janitor_task(standin_cli, eager))["action"] == "none (fleet not running)"

        # The next nightly adopts the kept cluster, and its cluster stage starts the fleet before the job.
        again = ensure_cluster(provider, spec, stack=site.stack, waiter_delay=1, waiter_max_attempts=10)
        assert again["adopted"] is True
        assert provider.hook.describe_compute_fleet(spec["name"])["status"] == "RUNNING"
    finally:
        slurm.close()
        delete_cluster(provider, spec["name"], waiter_delay=1, waiter_max_attempts=10)
