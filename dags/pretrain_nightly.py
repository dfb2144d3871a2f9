"""Nightly pretraining on the data partition of the run's logical date (YYYY-MM-DD).

Keeps the stack's network, image and cluster between nights (nothing is torn down): each night adopts
them (creating only what is missing) and stamps their `pcflow:expires` `teardown.keep_hours` (48 h)
ahead, so the janitor deletes them once the nights stop. With a static cluster the cluster is the
site's, never deleted. Each night's model and last checkpoint go to `s3://<bucket>/runs/<run key>/model/`.
One run at a time, so a backfill (`airflow backfill create --dag-id pretrain_nightly --from-date ...
--to-date ... --dag-run-conf '{...}' --max-active-runs 1`: a backfill has its own limit, not the DAG's)
retrains past partitions one after another on the same cluster.
Each run writes under its own run key, so two runs never write the same place.
A stage that fails for good is reported to the profile's `alerts.sns_topic_arn` (pcflow/alerts.py): the
nightly is on a schedule, so nobody watches it (`alerts.on_run_failure: unattended`, the default).
When it runs is the default profile's `nightly` section: at 02:00 UTC (`schedule: clock`, `cron`), or when
a partition of the stack's dataset gets new content (`schedule: data`: an event of its dataset Asset),
training on that partition (pcflow/lineage.py). With the profile's `nightly.warm_start: latest`, each night
starts from the stack's newest model (the last successful night's; pcflow/warmstart.py), unless its conf
names another `training.warm_start`.
"""

from airflow.sdk import DAG

from pcflow.lineage import nightly_schedule
from pcflow.pipeline import TRAINING_DAG_ARGS, build_training_pipeline, training_params

with DAG(
    dag_id="pretrain_nightly",
    schedule=nightly_schedule(),  # the default profile's `nightly` section: a cron, or new data
    catchup=False,
    params=training_params(),
    **TRAINING_DAG_ARGS,  # a failed stage is published to the profile's alerts topic (pcflow.alerts)
    max_active_runs=1,
    tags=["pcflow", "training", "nightly"],
    doc_md=__doc__,
):
    build_training_pipeline(run_scoped=False, dated_partitions=True, nightly=True)
