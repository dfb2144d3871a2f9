"""The training pipeline, composed once and shared by every DAG (pretrain, nightly, sweep) or used as a
task group in a DAG of your own.

- `form`: the trigger form (Params with JSON schema);
- `settings`: Params -> run spec, the run's own values, and `RUN` (how operators read them);
- `validation`: the first task, which refuses bad settings before anything costs money;
- `tasks`: the small tasks between the operators;
- `assembly`: the stages declared per phase (infrastructure, training, teardown), as a DAG's tasks or a
  task group.
"""

from pcflow.pipeline.assembly import (
    CLUSTER_POOL,
    DEFAULT_ARGS,
    DEFAULT_STAGE_TIMEOUT,
    PRETRAINED_ENCODER,
    STAGE_TIMEOUTS,
    TRAINING_DAG_ARGS,
    TRIAL_POOL,
    build_training_pipeline,
    pretrained_encoder,
    training_pipeline_group,
)
from pcflow.pipeline.form import FORM_FIELDS, MAX_TRIALS, OTHER_FIELDS, profile_param, sweep_params, training_params
from pcflow.pipeline.settings import (
    EXISTING_FILE_SYSTEM,
    RUN,
    VALIDATE_TASK,
    RunEnv,
    early_stopping_rule,
    expand_trials,
    overrides_from_params,
    resolve_for_run,
    run_env,
    task_value,
)
from pcflow.pipeline.validation import planned_cluster, validate_run

__all__ = [
    "CLUSTER_POOL",
    "DEFAULT_ARGS",
    "DEFAULT_STAGE_TIMEOUT",
    "EXISTING_FILE_SYSTEM",
    "FORM_FIELDS",
    "MAX_TRIALS",
    "OTHER_FIELDS",
    "PRETRAINED_ENCODER",
    "RUN",
    "STAGE_TIMEOUTS",
    "TRAINING_DAG_ARGS",
    "TRIAL_POOL",
    "VALIDATE_TASK",
    "RunEnv",
    "build_training_pipeline",
    "early_stopping_rule",
    "expand_trials",
    "overrides_from_params",
    "planned_cluster",
    "pretrained_encoder",
    "profile_param",
    "resolve_for_run",
    "run_env",
    "sweep_params",
    "task_value",
    "training_params",
    "training_pipeline_group",
    "validate_run",
]
