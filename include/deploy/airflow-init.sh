#!/usr/bin/env bash
# airflow-init (docker-compose.yaml): the one-off setup every other Airflow service waits for. It fails
# (and compose starts nothing else) when any step fails: the database migration, the first user, or
# pcflow's pools, which its cluster and train tasks cannot run without.
#   - the metadata database, migrated (Airflow's tables and the FAB auth manager's);
#   - the first user of the FAB auth manager: _AIRFLOW_WWW_USER_USERNAME (default airflow), role Admin,
#     with _AIRFLOW_WWW_USER_PASSWORD; kept as it is when it exists (change its password in the UI);
#   - pcflow's pools from PCFLOW_POOLS_FILE (include/pools.json), created or resized;
#   - the logs volume, owned by AIRFLOW_UID.
# tests/deploy runs this same file on the host with the environment compose gives the service.
set -euo pipefail

: "${_AIRFLOW_WWW_USER_PASSWORD:?set _AIRFLOW_WWW_USER_PASSWORD in .env}"
: "${PCFLOW_POOLS_FILE:?the pools file (include/pools.json) is not set}"
logs="${AIRFLOW__LOGGING__BASE_LOG_FOLDER:-${AIRFLOW_HOME:-/opt/airflow}/logs}"
if [[ -z "${AIRFLOW_UID:-}" ]]; then
  echo "WARNING: AIRFLOW_UID not set: set it in .env (echo AIRFLOW_UID=\$(id -u) >> .env)" >&2
fi

airflow db migrate
# The official image's entrypoint creates its first user the same way (the password on argv, inside
# this short-lived container only).
airflow users create --role Admin --username "${_AIRFLOW_WWW_USER_USERNAME:-airflow}" \
  --password "${_AIRFLOW_WWW_USER_PASSWORD}" --firstname Airflow --lastname Admin \
  --email "${_AIRFLOW_WWW_USER_EMAIL:-airflow@example.com}"
airflow pools import "${PCFLOW_POOLS_FILE}"

mkdir -p "$logs"
chown -R "${AIRFLOW_UID:-50000}:0" "$logs"
echo "airflow-init: database migrated, first user and pools in place"
