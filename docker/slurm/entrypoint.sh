#!/usr/bin/env bash
# One role of the local profile's Slurm cluster per container: init | slurmdbd | slurmctld | slurmd | sshd.
# A slurmd container is the compute node named as its hostname (compose: node1, node2, node3).
# Every daemon role starts munged first (same key, from local-init's volume) and runs in the foreground.
set -euo pipefail

role="${1:-slurmd}"
root=/pcflow-local
if [ "$role" = init ]; then
  exec /usr/local/bin/init.sh
fi

for _ in $(seq 60); do [ -s "$root/slurm/slurm.conf" ] && break; sleep 1; done
install -d /etc/slurm /var/spool/slurmctld /var/spool/slurmd /run/munge /run/sshd
ln -sf "$root/slurm/slurm.conf" /etc/slurm/slurm.conf
install -o munge -g munge -m 0400 "$root/munge/munge.key" /etc/munge/munge.key
chown munge:munge /run/munge
runuser -u munge -- /usr/sbin/munged --force

case "$role" in
  slurmdbd)
    install -m 0600 "$root/slurm/slurmdbd.conf" /etc/slurm/slurmdbd.conf
    exec /usr/sbin/slurmdbd -D
    ;;
  slurmctld)
    # Register the cluster with accounting once slurmdbd answers (sacct then sees the jobs).
    ( for _ in $(seq 60); do sacctmgr -i add cluster pcflow-local >/dev/null 2>&1 && break
        sacctmgr -n list cluster format=cluster 2>/dev/null | grep -qw pcflow-local && break; sleep 2; done ) &
    exec /usr/sbin/slurmctld -D
    ;;
  slurmd)
    exec /usr/sbin/slurmd -D -N "$(hostname)"
    ;;
  sshd)
    # The cluster's login node: Slurm's client commands + the shared root, reached by Airflow over SSH.
    exec /usr/sbin/sshd -D -e \
      -o HostKey="$root/ssh/ssh_host_ed25519_key" \
      -o AuthorizedKeysFile="$root/ssh/authorized_keys" \
      -o PermitRootLogin=prohibit-password -o PasswordAuthentication=no \
      -o KbdInteractiveAuthentication=no -o UsePAM=no -o StrictModes=no \
      -o MaxStartups=100:30:200 -o MaxSessions=100 \
      -o "SetEnv=OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"  # jobs run as root here; mpirun asks
    ;;
  *)
    echo "unknown role: $role (init | slurmdbd | slurmctld | slurmd | sshd)" >&2
    exit 2
    ;;
esac
