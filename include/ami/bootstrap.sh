#!/bin/bash
# Runs once on the AMI builder (through SSM RunCommand), on top of a ParallelCluster image of the
# configured version, so that every cluster node boots with the training ENVIRONMENT ready: what
# the seeds' workshop installed by hand on a running instance before creating its image. The
# training code is not baked: each run ships its payload to the shared file system
# (<shared root>/pcflow/payloads/<hash>/), so a changed payload needs no new image.
#
# PCFLOW_PAYLOAD_REQUIREMENTS: the payload's requirements.txt (the bake exports it before this
# script; it is part of the image's recipe hash, so new requirements bake a new image).
set -euxo pipefail

PCFLOW_HOME=/opt/pcflow
: "${PCFLOW_PAYLOAD_REQUIREMENTS:?the bake passes the payload environment's requirements}"

# The payload's Python environment (PyTorch with CUDA on GPU images), pinned by its requirements.
mkdir -p "$PCFLOW_HOME"
printf '%s\n' "$PCFLOW_PAYLOAD_REQUIREMENTS" > "$PCFLOW_HOME/payload-requirements.txt"
python3 -m venv "$PCFLOW_HOME/payload-venv"
"$PCFLOW_HOME/payload-venv/bin/pip" install --upgrade pip
"$PCFLOW_HOME/payload-venv/bin/pip" install -r "$PCFLOW_HOME/payload-requirements.txt"
"$PCFLOW_HOME/payload-venv/bin/python" -c 'import torch, torch.distributed as dist; assert dist.is_available()'

# GPU telemetry for the metrics sampler, when the image has NVIDIA drivers.
command -v nvidia-smi && nvidia-smi -L || true

# Clean up what must not be baked into an image: cloud-init state, SSH host keys, shell history.
rm -rf /var/lib/cloud/instances/*
rm -f /etc/ssh/ssh_host_* /root/.bash_history /home/*/.bash_history
