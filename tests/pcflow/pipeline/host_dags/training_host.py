"""A team's own DAG with pcflow's pipeline inside it, as a task group between its own first and last
tasks, and a param of its own beside the training form. Kept out of `dags/`, so users never see it:
tests/pcflow/pipeline/test_pipeline_group_run.py runs it on the local stack, test_pipeline_group.py
checks its shape."""

from airflow.sdk import DAG, Param, task

from pcflow.pipeline import training_params, training_pipeline_group


@task
def extract(**context) -> str:
    """The host's work before training; here it only reads the host's own param."""
    return context["params"]["note"]


@task
def publish(**context) -> dict:
    """The host's work after training: the group's results are its tasks', named `<group>.<stage>`."""
    metrics = context["ti"].xcom_pull(task_ids="training.metrics")
    return {"note": context["params"]["note"], "objective": metrics["objective"], "report": metrics["report"]}


with DAG(
    "training_host",
    schedule=None,
    params={**training_params(partition="default"), "note": Param("for the release notes", type="string")},
):
    extract() >> training_pipeline_group() >> publish()
