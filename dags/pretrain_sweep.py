"""A hyperparameter sweep: every trial in `trials` (crossed with every point of `grid`) runs as one
element of a Slurm job array on one shared cluster; at least half must succeed. Each trial's
hyperparameters are laid over the profile's; the leaderboard returns the best trial's.
Its failed cleanups alert, and its failed runs only where the profile asks, as `pretrain`'s do.
"""

from airflow.sdk import DAG

from pcflow.pipeline import TRAINING_DAG_ARGS, build_training_pipeline, sweep_params, training_params

with DAG(
    dag_id="pretrain_sweep",
    schedule=None,
    params=training_params(partition="default", extra=sweep_params()),
    **TRAINING_DAG_ARGS,
    max_active_runs=2,
    tags=["pcflow", "training", "sweep"],
    doc_md=__doc__,
):
    build_training_pipeline(run_scoped=True, sweep=True)
