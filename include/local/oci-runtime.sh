#!/bin/sh
# The local stack's OCI runtime for Slurm (oci.conf's RunTimeRun): runc, rootless, as the job's own account.
# Slurm 22.05 writes the step's config.json into its spool directory (%b) with the job's arguments and
# environment, and its root at <the bundle>/rootfs; two things it cannot know are set here before runc runs:
#   - the user namespace maps the container's root to the caller (the leased job account): an unprivileged
#     account may map only its own uid and gid, so each job's mapping is its own;
#   - the rootfs, a link in the job's bundle to the image unpacked once per digest on the shared root
#     (pcflow.slurm.images), is resolved: runc refuses a rootfs that is a link.
# Arguments: STATE_DIR (runc's state, one directory per account below it) BUNDLE CONTAINER_ID.
set -eu
state=$1
bundle=$2
id=$3
python3 - "$bundle/config.json" "$(id -u)" "$(id -g)" <<'PY'
import json, os, sys

path, uid, gid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(path) as f:
    config = json.load(f)
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
