# syntax=docker/dockerfile:1
# pcflow's Airflow image: the official slim Airflow 3.3.2 image (Python 3.11, as constraints.txt is
# resolved for; no providers of its own) + pcflow's runtime requirements at exactly the versions the
# tests run (constraints.txt) + the pcflow wheel + the ParallelCluster CLI in its own virtual environment
# with Node.js (AWS CDK synthesises the cluster's CloudFormation template on Node.js).
#   docker compose build          (docker-compose.yaml builds this file for every Airflow service)
ARG AIRFLOW_BASE_IMAGE=apache/airflow:slim-3.3.2-python3.11
FROM ${AIRFLOW_BASE_IMAGE}

# -- layer 1: the pcluster CLI environment (Node.js from Debian + aws-parallelcluster in /opt/pcluster), and
# git, which fetches a run's own code (pcflow.code.sources).
# The image runs as uid 50000 (its `airflow` user). Its pins (flask, connexion, jsii, CDK v1) conflict with Airflow's, so it never shares Airflow's venv.
USER 0
ARG PCLUSTER_VERSION=3.16.1
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends nodejs openssh-client git \
 && apt-get clean && rm -rf /var/lib/apt/lists/* \
 && install -d -o airflow -g 0 /opt/pcluster
COPY --chown=airflow:0 include/cluster/install-pcluster.sh /opt/pcflow/install-pcluster.sh
USER 50000
RUN PCLUSTER_VERSION="${PCLUSTER_VERSION}" PCLUSTER_PYTHON=/usr/local/bin/python \
    bash /opt/pcflow/install-pcluster.sh /opt/pcluster
ENV PCFLOW_PCLUSTER=/opt/pcluster/bin/pcluster

# -- layer 2: pcflow's runtime requirements under the project's constraints, so the image holds the
# environment the tests ran (make lock), Airflow pinned to the image's own version so pip never up- or
# downgrades it; pip check fails the build on any conflict with what the base image brought.
COPY --chown=airflow:0 requirements.txt constraints.txt /opt/pcflow/
RUN pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" -r /opt/pcflow/requirements.txt \
      -c /opt/pcflow/constraints.txt \
 && pip check

# -- layer 3: pcflow itself, built into a wheel from this checkout and installed (not editable) without
# dependencies: layer 2 installed them at the tested versions, and pip check confirms they meet the
# wheel's own ranges. Airflow finds the provider (connection type, triggers, links) by its entry point.
COPY --chown=airflow:0 pyproject.toml README.md /opt/pcflow/src/
COPY --chown=airflow:0 plugins/pcflow /opt/pcflow/src/plugins/pcflow
RUN pip install --no-cache-dir --no-deps /opt/pcflow/src -c /opt/pcflow/constraints.txt \
 && pip check

# dags/, plugins/ and include/ are mounted by docker-compose.yaml, which names include/'s mount in
# PCFLOW_INCLUDE_DIR (the wheel holds no include/ of its own). pcflow is imported from the installed
# wheel, also by the triggerer: site-packages come before the plugins folder Airflow appends to sys.path,
# so the mounted plugins/pcflow/ is never imported here and a change to it needs `docker compose build`.
