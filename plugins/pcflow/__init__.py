"""pcflow: distributed training on AWS ParallelCluster (Slurm) from Airflow 3.

An Airflow provider (`pyproject.toml`: the `pcflow` distribution, found by Airflow through its
`apache_airflow_provider` entry point, `pcflow.provider_info`). The source stays under `plugins/`:
an editable install (`make venv`) points the environment at it, and the triggerer, which never loads
the DAG folder, imports triggers by class path from the installed package.
"""

#: The one place pcflow's version is written (the wheel's metadata and the provider info read it).
#: Semantic versioning: see CHANGELOG.md.
__version__ = "0.1.0"
