#!/usr/bin/env bash
# Installs the local stack's system packages (Slurm, munge, MariaDB, sshd, Open MPI for the `mpirun`
# launcher and its test's mpicc; PostgreSQL and Redis for the deployment tests; sudo, through which the SSH
# user submits jobs as the job account; rsync, the peer benchmarks/code_shipping.py measures; git for code
# from repositories; runc, umoci and debootstrap for containers: Slurm's OCI runtime, the one import of an
# image, the local image's build) when any is missing.
# Debian/Ubuntu as root: apt-get. Anywhere else: a message that lists what to install.
set -euo pipefail

packages=(slurm-wlm slurmdbd munge openssh-server openssh-client mariadb-server mariadb-client chromium fonts-dejavu-core postgresql redis-server
          openmpi-bin libopenmpi-dev sudo rsync git runc umoci debootstrap)
programs=(slurmctld slurmd slurmdbd sbatch munged sshd ssh-keygen mariadbd mariadb-install-db chromium pg_ctlcluster redis-server
          mpirun mpicc sudo rsync git runc umoci debootstrap)

missing=()
for prog in "${programs[@]}"; do
  command -v "$prog" >/dev/null 2>&1 || [ -x "/usr/sbin/$prog" ] || missing+=("$prog")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "local stack: missing programs: ${missing[*]}"
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Package scripts may try to start the system's own services; the stack runs its own copies on
  # other ports and sockets, so a refusal to start them here is harmless.
  apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
  echo "local stack: installed ${packages[*]}"
  exit 0
fi
cat >&2 <<MSG
The local stack needs these system packages: ${packages[*]}
Install them with your package manager as root (Debian/Ubuntu: apt-get install ${packages[*]}),
or run the whole stack in containers: docker compose --profile local up (see README.md).
MSG
exit 1
