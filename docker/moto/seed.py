"""local-seed (docker compose --profile local): what an administrator prepares once in a real account
(the AMI builder's instance profile, the ParallelCluster base image stand-in), made in the emulator.
The same function the host's local stack uses (include/local/stack.py), pointed at the moto service."""

import sys
from types import SimpleNamespace

sys.path.insert(0, "/opt/airflow/include/local")
from stack import seed_emulated_account

seed_emulated_account(SimpleNamespace(aws_endpoint="https://moto:5000", ca_bundle="/pcflow-local/tls/ca.pem"))
print("local-seed: emulated account seeded")
