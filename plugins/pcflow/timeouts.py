"""How long each stage may take before Airflow fails it (its `execution_timeout`), in one place below every
layer: the pipeline gives its tasks these, the janitor DAG its own, and the locks a stage holds (the bake
lock, the network lock) count a lock older than its holder's timeout as left by a task that died, so the
two cannot drift apart. A DAG file that needs a timeout imports this module, not the pipeline.
"""

from __future__ import annotations

import datetime as dt

#: Each stage's execution_timeout, by task id (others: DEFAULT_STAGE_TIMEOUT). Generous, several times a slow run
#: on aws-gpu, so only a hung stage meets it: it then fails and its retry or the teardown takes over, instead of
#: holding a slot (or a deferred wait) for ever. Training has none: its Slurm time limit bounds the job.
STAGE_TIMEOUTS = {
    "network": dt.timedelta(minutes=45),
    "dataset": dt.timedelta(hours=6),  # a first upload of a large dataset
    "validate_cluster": dt.timedelta(minutes=45),
    "image": dt.timedelta(hours=3),  # builder, bootstrap, AMI snapshot
    "cluster": dt.timedelta(hours=2),  # ParallelCluster takes 15-40 minutes
    "stage_in": dt.timedelta(hours=6),
    "prepare_environment": dt.timedelta(hours=2),  # a first build downloads and installs the requirements
    "check_environment": dt.timedelta(minutes=45),  # a first full check hashes a CUDA environment's GiBs
    "prepare_image": dt.timedelta(hours=2),  # a first import of a CUDA image: GiBs pulled and squashed
    "metrics": dt.timedelta(hours=1),
    "delete_cluster": dt.timedelta(hours=6),  # includes the FSx export of the checkpoints
    "teardown": dt.timedelta(hours=2),
    "janitor": dt.timedelta(hours=1),
}
DEFAULT_STAGE_TIMEOUT = dt.timedelta(minutes=30)
