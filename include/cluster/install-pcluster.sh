#!/usr/bin/env bash
# Install the AWS ParallelCluster CLI into its own virtual environment (never Airflow's: its pins on
# flask, connexion, jsii, CDK v1 and packaging conflict with Airflow 3).
#
#   include/cluster/install-pcluster.sh [VENV_DIR]      default: <repo>/.venv-pcluster
#
# Requirements: Python >= 3.9 (PCLUSTER_PYTHON, default python3.11 then python3) and Node.js >= 14.21
# on PATH (AWS CDK, which `pcluster create-cluster`/`update-cluster`/`build-image` use to synthesise
# the CloudFormation template, runs on Node.js; read-only commands and `--dryrun true` do not need it,
# but a cluster cannot be created without it).
# Idempotent: a stamp file records the installed version; the second run returns at once.
set -euo pipefail

PCLUSTER_VERSION="${PCLUSTER_VERSION:-3.16.1}"
NODE_MIN_MAJOR=14
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${1:-${PCFLOW_PCLUSTER_VENV:-$repo/.venv-pcluster}}"
stamp="$venv/.pcflow-installed"

if [[ -f "$stamp" && "$(cat "$stamp")" == "aws-parallelcluster==$PCLUSTER_VERSION" && -x "$venv/bin/pcluster" ]]; then
  echo "pcluster $PCLUSTER_VERSION already installed in $venv"
  exit 0
fi

if ! command -v node >/dev/null 2>&1; then
  echo "Node.js is required by ParallelCluster (AWS CDK) for create-cluster: install Node.js >= $NODE_MIN_MAJOR (e.g. apt-get install nodejs, or nvm) and rerun" >&2
  exit 1
fi
node_major="$(node --version | sed -E 's/^v([0-9]+).*/\1/')"
if (( node_major < NODE_MIN_MAJOR )); then
  echo "Node.js $(node --version) is too old for ParallelCluster's CDK: install Node.js >= $NODE_MIN_MAJOR" >&2
  exit 1
fi

python="${PCLUSTER_PYTHON:-}"
if [[ -z "$python" ]]; then
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then python="$candidate"; break; fi
  done
fi
[[ -n "$python" ]] || { echo "no python3 found: set PCLUSTER_PYTHON=/path/to/python3" >&2; exit 1; }

rm -f "$stamp"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "aws-parallelcluster==$PCLUSTER_VERSION"
"$venv/bin/pcluster" version >/dev/null
echo "aws-parallelcluster==$PCLUSTER_VERSION" > "$stamp"
echo "pcluster $PCLUSTER_VERSION installed in $venv (Node.js $(node --version))"
