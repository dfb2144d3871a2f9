# syntax=docker/dockerfile:1
# pcflow's Airflow image: the official Airflow 3.3.2 image (Python 3.11, as constraints.txt is resolved
# for) + pcflow's runtime requirements + the ParallelCluster CLI in its own virtual environment with
# Node.js (AWS CDK synthesises the cluster's CloudFormation template on Node.js).
#   docker compose build          (docker-compose.yaml builds this file for every Airflow service)
ARG AIRFLOW_BASE_IMAGE=apache/airflow:3.3.2-python3.11
FROM ${AIRFLOW_BASE_IMAGE}

# -- layer 1: the pcluster CLI environment (Node.js from Debian + aws-parallelcluster in /opt/pcluster).
# The image runs as uid 50000 (its `airflow` user). Its pins (flask, connexion, jsii, CDK v1) conflict with Airflow's, so it never shares Airflow's venv.
USER 0
ARG PCLUSTER_VERSION=3.16.1
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends nodejs openssh-client \
 && apt-get clean && rm -rf /var/lib/apt/lists/* \
 && install -d -o airflow -g 0 /opt/pcluster
COPY --chown=airflow:0 include/cluster/install-pcluster.sh /opt/pcflow/install-pcluster.sh
USER 50000
RUN PCLUSTER_VERSION="${PCLUSTER_VERSION}" PCLUSTER_PYTHON=/usr/local/bin/python \
    bash /opt/pcflow/install-pcluster.sh /opt/pcluster
ENV PCFLOW_PCLUSTER=/opt/pcluster/bin/pcluster

# -- layer 2: pcflow's runtime requirements, Airflow pinned to the image's own version so pip never
# up- or downgrades it (the official "adding dependencies via requirements.txt" recipe).
COPY --chown=airflow:0 requirements.txt /opt/pcflow/requirements.txt
RUN pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" -r /opt/pcflow/requirements.txt

# dags/, plugins/ and include/ are mounted by docker-compose.yaml (the triggerer imports pcflow's
# triggers from plugins/, which Airflow puts on sys.path).
