# pcflow: the two commands a newcomer needs are `make demo` and `make test`; the rest are their parts.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
UV_VERSION := 0.13.9
STACK := $(PY) include/local/stack.py
AIRFLOW_UI := $(PY) include/local/airflow_ui.py
# Airflow's home (SQLite metadata, logs) lives with the rest of the generated local state.
export AIRFLOW_HOME ?= $(CURDIR)/.stack/airflow
PYTEST_ARGS ?=

PAYLOAD_VENV := .venv-payload

.PHONY: help setup system-deps venv payload-env local-image pcluster iam-simulator lock lint test demo example rehearsal concurrent airflow airflow-down chaos stack-up stack-down stack-status stack-clean clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

setup: system-deps venv  ## install system packages (when missing) and the Python environment

system-deps:  ## Slurm, munge, MariaDB, sshd from the OS packages, when missing
	@bash include/local/install-system-packages.sh

venv: $(VENV)/.installed  ## the Python 3.11 environment, exactly as constraints.txt pins it

$(VENV)/bin/uv:
	@command -v $(PYTHON) >/dev/null || { echo "pcflow needs Python 3.11 ($(PYTHON) not found); set PYTHON=/path/to/python3.11" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

# pcflow itself goes in editable, without dependencies (the line above pins them): the environment imports
# it from plugins/pcflow, the one copy, and Airflow finds the provider by its entry point. The checkout
# installed is the one the environment lives in (.venv resolved), also when .venv is a link to another's.
$(VENV)/.installed: requirements.txt requirements-dev.txt constraints.txt pyproject.toml | $(VENV)/bin/uv
	$(VENV)/bin/uv pip install --quiet --python $(PY) -r requirements-dev.txt -c constraints.txt
	$(VENV)/bin/uv pip install --quiet --python $(PY) --no-deps -e "$(dir $(realpath $(VENV)))"
	@touch $@

payload-env:  ## the training payload's environment (PyTorch CPU build), as a baked image holds it
	@bash include/payloads/install-payload-env.sh $(PAYLOAD_VENV)

local-image:  ## the local stack's container image (Debian + python3, an OCI layout in .stack-images/), once
	include/local/build-image.sh $(CURDIR)/.stack-images/debian-python3

pcluster:  ## the AWS ParallelCluster CLI in its own environment (needs Node.js; only for aws-gpu)
	@bash include/cluster/install-pcluster.sh

IAM_SIMULATOR := tests/deploy/iam_simulate
iam-simulator: $(IAM_SIMULATOR)/node_modules/.installed  ## the IAM policy evaluator tests/deploy/test_iam.py uses (npm, pinned)

$(IAM_SIMULATOR)/node_modules/.installed: $(IAM_SIMULATOR)/package.json $(IAM_SIMULATOR)/package-lock.json
	@command -v npm >/dev/null || { echo "the IAM policy tests need Node.js and npm (apt-get install nodejs npm)" >&2; exit 1; }
	npm ci --prefix $(IAM_SIMULATOR) --no-audit --no-fund --loglevel=error
	@touch $@

lock: | $(VENV)/bin/uv  ## re-resolve constraints.txt from PyPI after changing a requirements file
	$(VENV)/bin/uv pip compile requirements-dev.txt --python-version 3.11 --no-header --no-annotate -o constraints.txt

lint: venv  ## ruff, including Airflow 3's import rules (AIR), and the layers of pcflow's imports
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff check --preview --select AIR dags plugins
	$(VENV)/bin/lint-imports --no-cache

stack-up: setup  ## start the local stack (moto, Slurm, sshd); a no-op when it is up
	$(STACK) up

stack-down:  ## stop what stack-up started, and nothing else
	@if [ -x $(PY) ]; then $(STACK) down; else echo "stack down (no environment)"; fi

stack-status:  ## what is up, with pids and endpoints
	@if [ -x $(PY) ]; then $(STACK) status; else echo "stack not set up"; fi

stack-clean: airflow-down stack-down  ## stop the stack and delete its state (keys, databases, logs)
	@if [ -x $(PY) ]; then $(STACK) clean; fi
	@if [ -x $(PY) ] && [ -d .stack-lane-b ]; then PCFLOW_STACK_DIR=$(CURDIR)/.stack-lane-b $(STACK) clean; fi

test: setup payload-env pcluster iam-simulator lint  ## from nothing to a passing test suite (the tests start the stacks they need)
	@bash tests/lanes.sh $(PYTEST_ARGS)

demo: stack-up payload-env  ## run the pretrain DAG end to end on the embedded default
	@set -a && . .stack/env && set +a && $(PY) include/local/demo.py

EXAMPLE ?= resnet
# CONTAINER=local: in the local stack's image (built once by local-image); any other value is an image reference.
CONTAINER ?=
LOCAL_IMAGE := oci:$(CURDIR)/.stack-images/debian-python3:bookworm-python3
EXAMPLE_IMAGE := $(if $(filter local,$(CONTAINER)),$(LOCAL_IMAGE),$(CONTAINER))
example: stack-up payload-env $(if $(filter local,$(CONTAINER)),local-image)  ## train examples/$(EXAMPLE) from its own git repository on the local stack (EXAMPLE=resnet, simclr; CONTAINER=local: in a container)
	@set -a && . .stack/env && set +a && $(PY) include/local/example.py $(EXAMPLE) "$(EXAMPLE_IMAGE)"

rehearsal: stack-up payload-env pcluster iam-simulator  ## two pretrain runs and a 4-trial sweep at once with the production profile (aws-gpu) on the local stack
	@set -a && . .stack/env && set +a && $(PY) include/local/rehearsal.py

concurrent: stack-up payload-env  ## two pretrain runs and a 4-trial sweep at once on one stack, local profile
	@set -a && . .stack/env && set +a && $(PY) include/local/many_runs.py local

airflow: stack-up payload-env  ## the Airflow UI on this machine (compose's services, no containers); prints URL and login
	@$(AIRFLOW_UI) up

airflow-down:  ## stop what `make airflow` started, and nothing else (its database stays)
	@if [ -x $(PY) ]; then $(AIRFLOW_UI) down; else echo "airflow down (no environment)"; fi

chaos: stack-up payload-env  ## kill -9 each part of the Celery deployment and the cluster mid-run: the table of docs/reliability.md
	@$(PY) include/local/chaos.py $(CHAOS_ARGS)

clean: stack-clean  ## remove the environment and all generated state
	rm -rf $(VENV) .pytest_cache .ruff_cache tests/artifacts
