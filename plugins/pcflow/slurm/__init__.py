"""Slurm over SSH: the hook, the job spec and its rendering, the operator and its trigger."""

#: The SSH connection to the head node when a task names none (kept here, light, for operator signatures).
DEFAULT_SSH_CONN_ID = "slurm_default"
