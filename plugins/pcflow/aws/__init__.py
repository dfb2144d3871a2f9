"""AWS infrastructure stages: network, AMI bake, storage, convergent teardown and the janitor.

Each stage is a plain function taking boto3 clients (testable, reusable by other stages) with a thin
Airflow operator on top. Clients always use botocore's standard retry mode (see `clients`).
"""
