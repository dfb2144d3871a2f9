"""A hyperparameter sweep: every trial in `trials` runs as one element of a Slurm job array on one
shared cluster; at least half must succeed. Each trial's hyperparameters are laid over the profile's.
"""

from airflow.sdk import DAG, Param

from pcflow.pipeline import TRAINING_DAG_ARGS, build_training_pipeline, training_params

with DAG(
    dag_id="pretrain_sweep",
    schedule=None,
    params={
        **training_params(profile="local", partition="default"),
        "trials": Param(
            [{"lr": 0.001}, {"lr": 0.002}, {"lr": 0.004}],
            type="array",
            minItems=1,
            maxItems=1000,
            items={"type": "object"},
            title="Trials",
            description='One hyperparameter object per trial, e.g. [{"lr": 0.001}, {"lr": 0.01}].',
            section="Training",
        ),
    },
    **TRAINING_DAG_ARGS,
    max_active_runs=2,
    tags=["pcflow", "training", "sweep"],
    doc_md=__doc__,
):
    build_training_pipeline(run_scoped=True, sweep=True)
