"""Hourly: delete pcflow resources whose `pcflow:expires` has passed and whose DAG run Airflow says is
finished or gone, never one of a queued or running run (a killed run's network and cluster;
a stack's image, network and cluster once no run has stamped them for `teardown.keep_hours`), list what
is kept with its cost per day, and stop the compute fleet of a kept cluster whose queue has been idle
longer than its profile's `budget.idle_minutes` (the next run starts it). Triggered by hand it only
reports what it would delete or stop, unless the trigger form's `dry_run` is turned off. A task that
fails is reported to the `alerts.sns_topic_arn` of the deployment's default profile (pcflow/alerts.py)."""

from airflow.sdk import DAG, Param

import pcflow.cluster.teardown  # noqa: F401 - registers "pcluster", one of JANITOR_HANDLER_SETS
from pcflow.alerts import with_failure_alerts
from pcflow.aws.janitor import JANITOR_HANDLER_SETS, JanitorOperator
from pcflow.cluster.idle import StopIdleFleetsOperator
from pcflow.timeouts import STAGE_TIMEOUTS

with DAG(
    dag_id="janitor",
    schedule="@hourly",
    catchup=False,
    params={
        "dry_run": Param(
            None,
            type=["null", "boolean"],
            title="Dry run",
            description="Empty: dry run when triggered by hand, delete when scheduled.",
        )
    },
    render_template_as_native_obj=True,
    max_active_runs=1,
    tags=["pcflow", "cleanup"],
    doc_md=__doc__,
    # A failed task is published to the default profile's alerts topic, with every stack's leftovers.
    **with_failure_alerts({}, every_stack=True),
):
    StopIdleFleetsOperator(
        task_id="stop_idle_fleets", dry_run="{{ params.dry_run }}", execution_timeout=STAGE_TIMEOUTS["janitor"]
    ) >> JanitorOperator(
        task_id="reap",
        dry_run="{{ params.dry_run }}",
        handler_sets=JANITOR_HANDLER_SETS,
        execution_timeout=STAGE_TIMEOUTS["janitor"],
        trigger_rule="all_done",  # the reaping does not wait on a head node that did not answer
    )
