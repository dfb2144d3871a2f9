"""pcflow's page in the Airflow UI: stacks, runs, trends, leaderboards, the janitor's dry run, reports."""
