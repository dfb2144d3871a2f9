"""pcflow: distributed training on AWS ParallelCluster (Slurm) from Airflow 3.

Operators, hooks and triggers live here, under `plugins/`, because the triggerer imports triggers by
class path and never loads the DAG folder.
"""
