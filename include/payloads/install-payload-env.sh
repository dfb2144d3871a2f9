#!/usr/bin/env bash
# Create (or confirm) the training payload's virtual environment, as a baked AMI would hold it.
#
#   include/payloads/install-payload-env.sh <venv-dir> [requirements.txt]
#
# Uses pip (not uv) so that a wheel already on the machine (the local CPU build of torch) is what gets
# installed. Idempotent: a stamp file in the venv records the hash of the requirements and the base
# interpreter; when both match and the venv has its integrity record, the script exits at once without
# touching anything. A half-built venv (no stamp) is rebuilt from scratch. PAYLOAD_PYTHON picks the base
# interpreter (default the system's python3.11, then python3.11 or python3 on PATH): one every account can run.
#
# The last step writes the venv's integrity record (<venv>/.pcflow-record/, include/ami/tree-record.sh,
# as the image bake does on aws-gpu): pcflow checks the environment against it before a job runs in it
# (pcflow.slurm.environment). A venv built before records existed gets one without a rebuild.
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 <venv-dir> [requirements.txt]" >&2
  exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
venv=$1
requirements=${2:-$here/../../examples/simclr/requirements.txt}   # SimCLR, what the profiles train
# Jobs run as their own account (a profile's cluster.job_user), so the interpreter the venv links to must be
# one every account can run: the system's first (a pyenv or uv Python under /root is not).
system_python() {
  for candidate in /usr/bin/python3.11 /usr/local/bin/python3.11; do
    [ -x "$candidate" ] && { echo "$candidate"; return; }
  done
  command -v python3.11 || command -v python3
}
base=${PAYLOAD_PYTHON:-$(system_python)}
# Every directory on the way to it searchable, and the file executable, by others.
reachable_by_all() {
  local path
  path=$(readlink -f "$1")
  [ -n "$(find "$path" -maxdepth 0 -perm -o+x)" ] || return 1
  while [ "$path" != / ]; do
    path=$(dirname "$path")
    [ -n "$(find "$path" -maxdepth 0 -perm -o+x)" ] || return 1
  done
}
if ! reachable_by_all "$base"; then
  echo "payload env: $base ($(readlink -f "$base")) cannot be run by other accounts, and jobs run as their own" >&2
  echo "(a profile's cluster.job_user): set PAYLOAD_PYTHON to a system python3.11 (e.g. /usr/bin/python3.11)" >&2
  exit 1
fi
stamp="$venv/.pcflow-payload-stamp"

record() { # every module compiled first (so no run writes a .pyc into it later), then the record
  "$venv/bin/python" -m compileall -q -j 0 "$venv" >/dev/null || true # a file that does not compile stays so
  bash "$here/../ami/tree-record.sh" write "$venv"
}

want="$(sha256sum < "$requirements" | cut -d' ' -f1) $(readlink -f "$base")"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  if [ ! -d "$venv/.pcflow-record" ]; then
    echo "payload env $venv is up to date but has no integrity record (built before pcflow kept them): writing it"
    record
  fi
  echo "payload env $venv is up to date"
  exit 0
fi

echo "building payload env $venv from $requirements with $base"
rm -rf "$venv"
"$base" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --requirement "$requirements"
# Fail here, not in the first training job, if the environment cannot do what the payload needs.
"$venv/bin/python" -c 'import boto3, numpy, PIL, torch, webdataset, torch.distributed as dist; assert dist.is_available()'
printf '%s\n' "$want" > "$stamp.tmp" && mv -f "$stamp.tmp" "$stamp"
record
echo "payload env $venv ready (torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)'))"
