"""Self-supervised pretraining on a Slurm cluster, triggered by hand from the Airflow UI's form.

Everything this run creates (network, cluster) is torn down when it ends, also when training fails;
the run then still ends failed. The stages live in plugins/pcflow/pipeline.py.
"""

from airflow.sdk import DAG

from pcflow.pipeline import TRAINING_DAG_ARGS, build_training_pipeline, training_params

with DAG(
    dag_id="pretrain",
    schedule=None,
    params=training_params(partition="default"),
    **TRAINING_DAG_ARGS,
    max_active_runs=4,
    tags=["pcflow", "training"],
    doc_md=__doc__,
):
    build_training_pipeline(run_scoped=True)
