#!/bin/bash
# Runs once on the AMI builder (through SSM RunCommand), on top of a ParallelCluster image of the
# configured version, so that every cluster node boots with the training environment ready: what
# the seeds' workshop installed by hand on a running instance before creating its image.
set -euxo pipefail

PCFLOW_HOME=/opt/pcflow
PAYLOAD_REPO_ARCHIVE=${PAYLOAD_REPO_ARCHIVE:-}   # optional s3:// tarball of include/payloads

mkdir -p "$PCFLOW_HOME/payloads"
if [ -n "$PAYLOAD_REPO_ARCHIVE" ]; then
  aws s3 cp "$PAYLOAD_REPO_ARCHIVE" /tmp/payloads.tgz
  tar -xzf /tmp/payloads.tgz -C "$PCFLOW_HOME/payloads"
fi

# The payload's Python environment (PyTorch with CUDA on GPU images), pinned by its requirements.
python3 -m venv "$PCFLOW_HOME/payload-venv"
"$PCFLOW_HOME/payload-venv/bin/pip" install --upgrade pip
if [ -f "$PCFLOW_HOME/payloads/simclr/requirements.txt" ]; then
  "$PCFLOW_HOME/payload-venv/bin/pip" install -r "$PCFLOW_HOME/payloads/simclr/requirements.txt"
fi

# GPU telemetry for the metrics sampler, when the image has NVIDIA drivers.
command -v nvidia-smi && nvidia-smi -L || true

# Clean up what must not be baked into an image: cloud-init state, SSH host keys, shell history.
rm -rf /var/lib/cloud/instances/* /tmp/payloads.tgz
rm -f /etc/ssh/ssh_host_* /root/.bash_history /home/*/.bash_history
