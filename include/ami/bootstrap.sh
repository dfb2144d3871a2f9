#!/bin/bash
# Runs once on the AMI builder (through SSM RunCommand), on top of a ParallelCluster image of the
# configured version, so that every cluster node boots with the training ENVIRONMENT ready: what
# the seeds' workshop installed by hand on a running instance before creating its image. The
# training code is not baked: each run ships its payload to the shared file system
# (<shared root>/pcflow/payloads/<hash>/), so a changed payload needs no new image.
#
# The bake (pcflow.aws.ami.AmiSpec.commands) runs this file with bash, its inputs in the environment;
# they are part of the image's recipe hash, so new requirements bake a new image:
#   PCFLOW_PAYLOAD_REQUIREMENTS  the payload's requirements.txt
#   PCFLOW_PYTHON_MIN            the oldest Python they install on, 3.X (their `# requires-python: >=3.X`)
#   PCFLOW_TREE_RECORD           include/ami/tree-record.sh, which writes the environment's integrity record
# PCFLOW_ROOT (tests only, unset on a builder): a directory that stands for / in every system path.
#
# The pinned uv goes to /opt/pcflow/bin/uv (UV_VERSION, checked against its wheel's sha256): a run whose
# code names requirements gets its own environment built with it on the cluster (pcflow.slurm.envs, the
# profile's training.environment.builder), layered on the payload environment below.
#
# The interpreter: the newest python3.X >= PCFLOW_PYTHON_MIN on PATH that can make a venv, else a
# standalone CPython of that version installed by the pinned uv (the images' own python3 is 3.10 on
# Ubuntu 22.04, 3.9 on Amazon Linux 2023 and RHEL 9; 3.12 on Ubuntu 24.04, without ensurepip unless
# python3-venv is installed).
set -euxo pipefail

export HOME=${HOME:-/root} # SSM runs the command as root, without HOME
root=${PCFLOW_ROOT:-}
PCFLOW_HOME=$root/opt/pcflow
: "${PCFLOW_PAYLOAD_REQUIREMENTS:?the bake passes the requirements of the payload environment}"
: "${PCFLOW_PYTHON_MIN:?the bake passes the oldest Python the requirements install on}"
: "${PCFLOW_TREE_RECORD:?the bake passes include/ami/tree-record.sh}"
UV_VERSION=0.13.9 # the project's uv (Makefile); its wheels on PyPI, by architecture, and their sha256
UV_WHEEL_x86_64=3d/aa/26d64642d808de4a652579ef950d7cd2d37f080a8babf9c67c6b75fc4c3f/uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
UV_SHA256_x86_64=d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19
UV_WHEEL_aarch64=57/15/94b6cd62ac3ff6550288328e8035288875197cbc183f51554b266a69877b/uv-0.13.9-py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64.musllinux_1_1_aarch64.whl
UV_SHA256_aarch64=5435c5ce14a56431208ca0996416d310f1598e8c2c8ba707688985a16bb82dbe

fail() {
  echo "pcflow bootstrap: $*" >&2
  exit 1
}

os_name() { # the base image's OS, as its os-release names it
  (. "$root/etc/os-release" && echo "${PRETTY_NAME:-$ID $VERSION_ID}") 2>/dev/null || echo "an OS without $root/etc/os-release"
}

[[ $PCFLOW_PYTHON_MIN =~ ^3\.([0-9]{1,2})$ ]] || fail "PCFLOW_PYTHON_MIN=$PCFLOW_PYTHON_MIN is not a version 3.X"
need=${BASH_REMATCH[1]}
found="" # what was tried, for the message when nothing fits

usable() { # $1 is at least Python 3.$need and can make a venv (Debian's python3 needs python3-venv for that)
  local version
  version=$("$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || return 1
  found+="${found:+, }$1 $version"
  [[ $version =~ ^3\.([0-9]+)$ ]] && ((BASH_REMATCH[1] >= need)) || return 1
  "$1" -c 'import ensurepip, venv' 2>/dev/null || {
    found+=" (no venv module)"
    return 1
  }
}

find_python() { # sets `python` to the newest usable interpreter on PATH
  local minor candidate
  for ((minor = 20; minor >= need; minor--)); do
    candidate=$(command -v "python3.$minor") && usable "$candidate" && python=$candidate && return
  done
  candidate=$(command -v python3) && usable "$candidate" && python=$candidate
}

install_uv() { # the pinned uv at $PCFLOW_HOME/bin/uv, checked against its pin: it builds the runs' own environments
  # (a profile's training.environment.builder) and, where the image has no usable Python, installs one
  local arch wheel sha
  [ ! -x "$PCFLOW_HOME/bin/uv" ] || return 0
  arch=$(uname -m)
  wheel=UV_WHEEL_$arch sha=UV_SHA256_$arch
  [[ -n ${!wheel:-} ]] || fail "no pinned uv for $arch on $(os_name)"
  curl --fail --silent --show-error --location --retry 3 -o "$tmp/uv.whl" \
    "https://files.pythonhosted.org/packages/${!wheel}" || return 1
  echo "${!sha}  $tmp/uv.whl" | sha256sum --check --status ||
    fail "the uv $UV_VERSION wheel downloaded does not have its pinned sha256 (${!sha}); nothing installed"
  "${python:-python3}" -m zipfile -e "$tmp/uv.whl" "$tmp/uv" || return 1
  mkdir -p "$PCFLOW_HOME/bin" && cp "$tmp/uv/uv-$UV_VERSION.data/scripts/uv" "$PCFLOW_HOME/bin/uv" &&
    chmod 755 "$PCFLOW_HOME/bin/uv"
}

install_python() { # a standalone CPython 3.$need under $PCFLOW_HOME/python, by the pinned uv
  local candidate
  install_uv || return 1
  local uv=("$PCFLOW_HOME/bin/uv" --no-config --cache-dir "$tmp/cache")
  UV_PYTHON_INSTALL_DIR=$PCFLOW_HOME/python "${uv[@]}" python install --no-bin "3.$need" || return 1
  candidate=$(UV_PYTHON_INSTALL_DIR=$PCFLOW_HOME/python "${uv[@]}" python find --managed-python --no-project "3.$need") &&
    usable "$candidate" && python=$candidate
}

tmp=$(mktemp -d) # the uv wheel and its cache: not baked into the image
trap 'rm -rf "$tmp"' EXIT
python=""
find_python || install_python ||
  fail "no Python >= $PCFLOW_PYTHON_MIN for the payload's requirements on $(os_name): found ${found:-no python3 on PATH}," \
    "and installing CPython $PCFLOW_PYTHON_MIN with uv $UV_VERSION failed (see above)"
echo "payload environment on $("$python" -c 'import sys; print(sys.version.split()[0])') ($python) on $(os_name)"
install_uv || fail "the pinned uv $UV_VERSION could not be installed at $PCFLOW_HOME/bin/uv (see above): runs build their" \
  "own environments with it"

# The payload's Python environment (PyTorch with CUDA on GPU images), pinned by its requirements. No pip
# cache: its wheels (gigabytes of CUDA libraries) would be baked into the image.
mkdir -p "$PCFLOW_HOME"
printf '%s\n' "$PCFLOW_PAYLOAD_REQUIREMENTS" >"$PCFLOW_HOME/payload-requirements.txt"
"$python" -m venv --clear "$PCFLOW_HOME/payload-venv"
"$PCFLOW_HOME/payload-venv/bin/python" -m pip install --no-cache-dir --upgrade pip
"$PCFLOW_HOME/payload-venv/bin/python" -m pip install --no-cache-dir -r "$PCFLOW_HOME/payload-requirements.txt"
"$PCFLOW_HOME/payload-venv/bin/python" -c 'import torch, torch.distributed as dist; assert dist.is_available()'
# Its integrity record, which pcflow checks before a job runs in it (pcflow.slurm.environment): every module
# compiled first, so no run writes a .pyc into it later (a file that does not compile stays uncompiled).
"$PCFLOW_HOME/payload-venv/bin/python" -m compileall -q -j 0 "$PCFLOW_HOME/payload-venv" >/dev/null || true
set +x # the script's text would fill the command's output
bash -c "$PCFLOW_TREE_RECORD" tree-record.sh write "$PCFLOW_HOME/payload-venv"
set -x

# GPU telemetry for the metrics sampler, when the image has NVIDIA drivers.
command -v nvidia-smi && nvidia-smi -L || true

# Clean up what must not be baked into an image: cloud-init state, SSH host keys, shell history.
rm -rf "$root"/var/lib/cloud/instances/*
rm -f "$root"/etc/ssh/ssh_host_* "$root"/root/.bash_history "$root"/home/*/.bash_history
