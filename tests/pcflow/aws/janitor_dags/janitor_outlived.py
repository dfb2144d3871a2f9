"""A run that outlives its TTL (tests/pcflow/aws/test_janitor_dagrun.py): its first task makes the run's
network stamped as already expired (a TTL shrunk below zero), its second runs the janitor over the
stack while this DAG run is still running. A second run of the DAG with only `reap` is the janitor
once the first run has finished."""

from airflow.sdk import DAG, Param

from pcflow.aws.janitor import JanitorOperator
from pcflow.aws.network import EnsureNetworkOperator

with DAG(
    dag_id="janitor_outlived",
    schedule=None,
    params={"stack": Param("janitor", type="string")},
    render_template_as_native_obj=True,
):
    EnsureNetworkOperator(
        task_id="network", stack="{{ params.stack }}", run_scoped=True, ttl_hours=-1, waiter_delay=0
    ) >> JanitorOperator(task_id="reap", stack="{{ params.stack }}", dry_run=False, handler_sets=("ec2",), pass_delay=0)
