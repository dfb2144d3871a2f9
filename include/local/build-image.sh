#!/usr/bin/env bash
# Builds the local stack's container image: a minimal Debian (debootstrap --variant=minbase, from the
# Debian mirror apt uses) with python3, as an OCI image layout that a run names as
#   training.container: oci:<LAYOUT>:<TAG>
# (no registry is needed: Slurm's OCI support runs it, pcflow unpacks it once per digest with umoci).
# Usage: build-image.sh LAYOUT [TAG]   (default TAG: bookworm-python3)
# A layout that already has TAG is kept as it is (the build takes about a minute; its digest then stays
# the same for every later run). Built in a temporary directory and renamed into place. As root
# (debootstrap). PCFLOW_DEBIAN_MIRROR: another mirror.
set -euo pipefail

layout=${1:?usage: build-image.sh LAYOUT [TAG]}
tag=${2:-bookworm-python3}
mirror=${PCFLOW_DEBIAN_MIRROR:-http://deb.debian.org/debian}
path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

if [ -f "$layout/index.json" ] && grep -qF "\"org.opencontainers.image.ref.name\":\"$tag\"" "$layout/index.json"; then
  echo "local image: $layout:$tag is built already"
  exit 0
fi
for tool in debootstrap umoci; do
  command -v "$tool" >/dev/null || [ -x "/usr/sbin/$tool" ] || {
    echo "local image: $tool is missing (make system-deps)" >&2
    exit 1
  }
done
parent=$(dirname "$layout")
mkdir -p "$parent"
work=$(mktemp -d "$parent/.build-XXXXXX")
trap 'rm -rf "$work"' EXIT

PATH=$PATH:/usr/sbin debootstrap --variant=minbase --include=python3 bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 || {
  tail -20 "$work/debootstrap.log" >&2
  exit 1
}
rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"*
# What a job can check to know it ran in this image.
printf 'pcflow local image %s, built by include/local/build-image.sh\n' "$tag" >"$work/rootfs/etc/pcflow-image"

umoci init --layout "$work/layout"
umoci new --image "$work/layout:$tag"
umoci unpack --image "$work/layout:$tag" "$work/bundle" >/dev/null
rm -rf "$work/bundle/rootfs"
mv "$work/rootfs" "$work/bundle/rootfs"
umoci repack --image "$work/layout:$tag" "$work/bundle"
umoci config --image "$work/layout:$tag" --config.env "PATH=$path" --config.workingdir / --config.cmd python3
umoci gc --layout "$work/layout"
rm -rf "$layout"
mv -T "$work/layout" "$layout"
echo "local image: built $layout:$tag"
