#!/bin/sh
# The local stack's OCI runtime for Slurm (oci.conf's RunTimeRun): runc, rootless, as the job's own account.
# Slurm 22.05 writes the step's config.json into its spool directory (%b) with the job's arguments and
# environment, and its root at <the bundle>/rootfs; what it leaves wrong or cannot know is set here before
# runc runs:
#   - the user namespace maps the container's root to the caller (the leased job account): an unprivileged
#     account may map only its own uid and gid, so each job's mapping is its own;
#   - the rootfs, a link in the job's bundle to the image unpacked once per digest on the shared root
#     (pcflow.slurm.images), is resolved: runc refuses a rootfs that is a link;
#   - the task's identity: 22.05 writes the same SLURM_PROCID, SLURM_NODEID, SLURMD_NODENAME (the first
#     node's task's) into every node's config. It runs one task per node in a container (it refuses more),
#     so the task's rank is its node's place in the step's node list (this node: %n, the id's first part).
# Arguments: STATE_DIR (runc's state, one directory per account below it) BUNDLE CONTAINER_ID.
set -eu
state=$1
bundle=$2
id=$3
python3 - "$bundle/config.json" "$(id -u)" "$(id -g)" "${id%%.*}" <<'PY'
import json, os, subprocess, sys

path, uid, gid, node = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
with open(path) as f:
    config = json.load(f)
env = dict(item.split("=", 1) for item in config["process"].get("env", []) if "=" in item)
if env.get("SLURM_STEP_NODELIST"):
    listed = subprocess.run(
        ["scontrol", "show", "hostnames", env["SLURM_STEP_NODELIST"]],
        env={**os.environ, "SLURM_CONF": env.get("SLURM_CONF", os.environ.get("SLURM_CONF", ""))},
        capture_output=True, text=True, check=True,
    ).stdout.split()
    rank = str(listed.index(node))
    env.update(SLURMD_NODENAME=node, SLURM_NODEID=rank, SLURM_PROCID=rank, SLURM_GTIDS=rank, SLURM_LOCALID="0")
    env.pop("SLURM_TASK_PID", None)
    config["process"]["env"] = [f"{key}={value}" for key, value in env.items()]
linux = config.setdefault("linux", {})
linux["uidMappings"] = [{"containerID": 0, "hostID": uid, "size": 1}]
linux["gidMappings"] = [{"containerID": 0, "hostID": gid, "size": 1}]
config["process"].pop("rlimits", None)  # this host's containers refuse rlimits (the stack's README)
config["root"]["path"] = os.path.realpath(config["root"]["path"])
with open(path + ".tmp", "w") as f:
    json.dump(config, f)
os.replace(path + ".tmp", path)
PY
exec runc --rootless=true --root="$state/$(id -un)" run "$id" --bundle "$bundle"
