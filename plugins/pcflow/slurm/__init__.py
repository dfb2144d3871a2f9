"""Slurm over SSH: the hook, the job spec and its rendering, the operator and its trigger."""
