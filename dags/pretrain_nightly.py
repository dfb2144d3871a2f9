"""Nightly pretraining on the data partition of the run's logical date (YYYY-MM-DD).

Network, image and cluster are shared by the stack and kept between nights; one run at a time, so a
backfill (`airflow backfill create --dag-id pretrain_nightly --from-date ... --to-date ...
--dag-run-conf '{...}' --max-active-runs 1`: a backfill has its own limit, not the DAG's) retrains past
partitions one after another without a cluster per day.
Each run writes under its own run key, so two runs never write the same place.
"""

from airflow.sdk import DAG

from pcflow.pipeline import TRAINING_DAG_ARGS, build_training_pipeline, training_params

with DAG(
    dag_id="pretrain_nightly",
    schedule="0 2 * * *",
    catchup=False,
    params=training_params(),
    **TRAINING_DAG_ARGS,
    max_active_runs=1,
    tags=["pcflow", "training", "nightly"],
    doc_md=__doc__,
):
    build_training_pipeline(run_scoped=False, dated_partitions=True)
