#!/usr/bin/env bash
# `make test`: the suite in two lanes at once, each with a local stack of its own (PCFLOW_STACK_DIR:
# its own ports, moto, Slurm, sshd and Airflow home). Most of a test's time is spent waiting on Slurm
# jobs, AWS stand-ins and Airflow's services, so the modules that take minutes (the Celery deployment,
# the rehearsal of aws-gpu) run beside the rest instead of after them. Lane B's output follows lane A's.
# Arguments go to both pytest runs.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
# About half the suite's time each (measured in CI): lane B the Celery deployment, the rehearsal and
# the local profile's longest DAG runs; lane A everything else.
LANE_B=(
    tests/deploy/test_celery_deployment.py tests/dags/test_rehearsal.py tests/dags/test_dags.py
    tests/dags/test_node_loss.py tests/dags/test_budget_cap.py tests/dags/test_crash_retry.py
    tests/pcflow/pipeline/test_pipeline_group_run.py
)
LANE_B_STATE="$PWD/.stack-lane-b"
mkdir -p tests/artifacts
ignores=()
for path in "${LANE_B[@]}"; do ignores+=(--ignore "$path"); done

# Lane B's job ids start at 501: jobs listen for their rendezvous on every address at a port derived from
# the job id, and the two stacks' job 5 met there (EADDRINUSE).
in_lane_b() { PCFLOW_STACK_DIR="$LANE_B_STATE" AIRFLOW_HOME="$LANE_B_STATE/airflow" PCFLOW_FIRST_JOB_ID=501 "$@"; }
stack_a() { $PY include/local/stack.py "$@"; }
stack_b() { in_lane_b $PY include/local/stack.py "$@"; }
is_up() { "$1" status --json 2>/dev/null | $PY -c 'import json, sys; sys.exit(not all(s["ready"] for s in json.load(sys.stdin).values()))'; }
# The two stacks come up one after the other: each picks free ports when its state is created, and two
# made at the same moment were once given the same port. A stack that was up already (a developer's)
# stays up; those started here are stopped here.
started=()
stacks_down() { for stack in "${started[@]}"; do "$stack" down >/dev/null 2>&1; done; }
trap stacks_down EXIT
for stack in stack_a stack_b; do
    is_up "$stack" || started+=("$stack")
    "$stack" up || exit 1
done

in_lane_b $PY -m pytest "$@" "${LANE_B[@]}" >tests/artifacts/lane-b.log 2>&1 &
lane_b=$!
trap 'kill "$lane_b" 2>/dev/null; stacks_down' EXIT INT TERM
$PY -m pytest "$@" "${ignores[@]}"
status_a=$?
wait "$lane_b"
status_b=$?
trap stacks_down EXIT
echo "================ lane B: ${LANE_B[*]} (own stack in $LANE_B_STATE) ================"
cat tests/artifacts/lane-b.log
echo "lanes: A exited $status_a, B exited $status_b"
exit $(( status_a != 0 ? status_a : status_b ))
