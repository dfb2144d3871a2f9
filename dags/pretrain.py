"""Self-supervised pretraining on a Slurm cluster, triggered by hand from the Airflow UI's form.

What this run creates for itself (its network and, with ParallelCluster, its cluster) is deleted when
it ends, also when training fails; the run then still ends failed. What it keeps: the model and last
checkpoint in S3 (`s3://<bucket>/runs/<run key>/model/`), the stack's image (reused by later runs of
the same recipe; it expires `teardown.keep_hours` after the last run that used it) and the data
bucket. A static cluster is the site's and is never deleted. The stages: plugins/pcflow/pipeline/.
A failed cleanup (`delete_cluster`, `teardown`) is reported to the profile's `alerts.sns_topic_arn`
(pcflow/alerts.py): what it left keeps billing. A failed run only where `alerts.on_run_failure` is `all`:
the person who started it sees how it ended.
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
