"""A DAG of test_input_errors.py: one task per case of input_error_cases.py (each raises the stage's
error for one bad setting), and one that meets an unreachable Slurm head node on its first try. Every
task may be retried once, at once, so the run shows which failures Airflow retries."""

from __future__ import annotations

import datetime as dt

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG
from input_error_cases import CASES

#: The connection the first try uses: the local stack's head node at a port nothing listens on.
UNREACHABLE_CONN = "slurm_unreachable"


def slurm_unreachable_then_reached(ti) -> str:
    """Try 1: SSH to the head node is refused (an infrastructure error). Try 2: the stack's real head node."""
    from pcflow.slurm.hook import SlurmHook

    conn_id = UNREACHABLE_CONN if ti.try_number == 1 else "slurm_default"
    return SlurmHook(conn_id, connect_attempts=1).run(["sinfo", "--noheader", "--format=%P"]).stdout.strip()


with DAG(
    "input_error_retries",
    schedule=None,
    catchup=False,
    default_args={"retries": 1, "retry_delay": dt.timedelta(0)},
):
    for case in CASES:
        PythonOperator(task_id=case.name, python_callable=case.call)
    PythonOperator(task_id="slurm_unreachable_then_reached", python_callable=slurm_unreachable_then_reached)
