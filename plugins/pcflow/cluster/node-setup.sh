#!/bin/sh
# pcflow's node setup: ParallelCluster runs it as root on the head node and on every compute node once
# the node is configured (CustomActions OnNodeConfigured), so that jobs run as an account of their own
# that can reach none of the node role's credentials. pcflow uploads this file to the stack's bucket
# under its content hash (pcflow.cluster.node_setup); the rendered config names that object and passes:
#   $1 JOB_USER      the account jobs run as (the profile's cluster.job_user)
#   $2 JOB_UID       its uid and gid, the same on every node (cluster.config.job_uid): the shared file
#                    systems (FSx, /home) see numbers, not names
#   $3 CONTROL_USER  the SSH user pcflow submits with (ParallelCluster's default user of the OS): made a
#                    member of each job account's group, so that it reads what jobs write
#   $4 COUNT         how many accounts (cluster.job_accounts, default 1): JOB_USER, JOB_USER-1 ... with
#                    uids JOB_UID, JOB_UID+1 ...; each running run leases one (pcflow.slurm.accounts)
# What it does, each step checked first, so a second run changes nothing:
#   1. the groups and accounts: the given gids/uids, no home, no login shell, a locked password, in no
#      group that grants sudo;
#   2. the instance metadata service refused to those uids (iptables owner match, else an nftables table),
#      as AWS documents for limiting IMDS to some users: a job gets no credentials of the node's role;
#   3. this instance's IMDS options set to tokens required, hop limit 1 (ParallelCluster's launch
#      templates leave the hop limit to EC2's default, which a v2.0 image raises to 2): a container
#      behind a bridge (one hop more) gets no token, whatever its uid;
#   4. a copy of this script kept in /opt/pcflow and a boot unit that runs it again (the firewall of 2.
#      does not survive a reboot).
# PCFLOW_ROOT (tests only, unset on a node): a directory that stands for / in every system path.
set -eu

fail() {
  echo "pcflow node setup: $*" >&2
  exit 1
}

base_user=${1:-}
base_uid=${2:-}
control_user=${3:-}
count=${4:-1}
root=${PCFLOW_ROOT:-}
imds=169.254.169.254
imds6=fd00:ec2::254
nologin=/usr/sbin/nologin
kept=/opt/pcflow/node-setup.sh
unit=pcflow-node-setup.service
# The AWS CLI of ParallelCluster's images, useradd. (Not in tests: there PATH holds only their stand-ins,
# so a firewall tool of the machine running them is never reached.)
[ -n "$root" ] || PATH=$PATH:/usr/local/sbin:/usr/local/bin:/usr/sbin:/sbin

name_ok() { # a POSIX user name as useradd takes it (pcflow.patterns.JOB_USER)
  case $1 in '' | [0-9-]* | *[!a-z0-9_-]*) return 1 ;; esac
  [ "${#1}" -le 32 ]
}
name_ok "$base_user" || fail "JOB_USER '$base_user' is not a user name"
case $base_uid in '' | 0* | *[!0-9]*) fail "JOB_UID '$base_uid' is not a uid" ;; esac
[ "$base_uid" -ge 1000 ] && [ "$base_uid" -le 60000 ] || fail "JOB_UID $base_uid is outside 1000-60000"
name_ok "$control_user" || fail "CONTROL_USER '$control_user' is not a user name"
case $count in '' | 0* | *[!0-9]*) fail "COUNT '$count' is not a number of accounts" ;; esac
[ "$count" -le 64 ] || fail "COUNT $count is more than 64 accounts"
last_uid=$((base_uid + count - 1))
[ "$last_uid" -le 60000 ] || fail "JOB_UID $base_uid + COUNT $count reaches past uid 60000"

account() { # account INDEX: sets job_user and job_uid to the INDEXth account of the pool
  job_uid=$((base_uid + $1))
  if [ "$1" -eq 0 ]; then job_user=$base_user; else job_user=$base_user-$1; fi
  name_ok "$job_user" || fail "account $1 of JOB_USER '$base_user', $job_user, is not a user name"
}

entry() { # entry FILE FIELD VALUE: the first line of $root/etc/FILE whose field FIELD is VALUE
  awk -F: -v field="$2" -v value="$3" '$field == value { print; exit }' "$root/etc/$1"
}

field() { # field N LINE: the Nth colon-separated field of LINE
  printf '%s\n' "$2" | cut -d: -f "$1"
}

accounts() { # useradd, groupadd, usermod on this node's files (those under $root in tests)
  command=$1
  shift
  if [ -n "$root" ]; then "$command" --prefix "$root" "$@"; else "$command" "$@"; fi
}

check_account() { # every account checked first: a node that cannot match its peers changes nothing
  group=$(entry group 1 "$job_user")
  user=$(entry passwd 1 "$job_user")
  if [ -z "$group" ]; then
    taken=$(entry group 3 "$job_uid")
    [ -z "$taken" ] || fail "gid $job_uid belongs to group '$(field 1 "$taken")', not $job_user: choose another cluster.config.job_uid"
  elif [ "$(field 3 "$group")" != "$job_uid" ]; then
    fail "group $job_user has gid $(field 3 "$group"), not $job_uid: every node must give it the same gid"
  fi
  if [ -z "$user" ]; then
    taken=$(entry passwd 3 "$job_uid")
    [ -z "$taken" ] || fail "uid $job_uid belongs to '$(field 1 "$taken")', not $job_user: choose another cluster.config.job_uid"
  elif [ "$(field 3 "$user")" != "$job_uid" ] || [ "$(field 4 "$user")" != "$job_uid" ]; then
    fail "$job_user has uid:gid $(field 3 "$user"):$(field 4 "$user"), not $job_uid:$job_uid: every node must give it the same"
  fi
}

ensure_account() { # made where missing (check_account passed for every account of the pool)
  group=$(entry group 1 "$job_user")
  user=$(entry passwd 1 "$job_user")
  [ -n "$group" ] || accounts groupadd --gid "$job_uid" "$job_user"
  if [ -z "$user" ]; then
    accounts useradd --uid "$job_uid" --gid "$job_uid" --no-create-home --home-dir /nonexistent \
      --shell "$nologin" --comment "pcflow jobs" "$job_user"
  elif [ "$(field 7 "$user")" != "$nologin" ]; then
    accounts usermod --shell "$nologin" "$job_user"
  fi
}

refuse_sudo_groups() { # a job account in a group sudoers lets in would be root
  for admin in sudo wheel admin; do
    members=$(field 4 "$(entry group 1 "$admin")")
    case ",$members," in *",$job_user,"*) fail "$job_user is a member of group $admin (sudo): remove it" ;; esac
  done
}

ensure_control_user_in_group() {
  [ -n "$(entry passwd 1 "$control_user")" ] || fail "the SSH user $control_user does not exist on this node"
  members=$(field 4 "$(entry group 1 "$job_user")")
  case ",$members," in
    *",$control_user,"*) ;;
    *) accounts usermod --append --groups "$job_user" "$control_user" ;;
  esac
}

block_imds() { # the metadata service refused to the job uids, IPv4 and (where the node has it) IPv6
  uids=$base_uid
  [ "$count" -eq 1 ] || uids=$base_uid-$last_uid
  if command -v iptables >/dev/null 2>&1; then
    rule="OUTPUT --destination $imds --match owner --uid-owner $uids --jump REJECT"
    # shellcheck disable=SC2086 # $rule is pcflow's own words, split on purpose; the uid is digits
    iptables --wait --check $rule 2>/dev/null || iptables --wait --insert $rule
    if command -v ip6tables >/dev/null 2>&1; then
      rule="OUTPUT --destination $imds6 --match owner --uid-owner $uids --jump REJECT"
      # shellcheck disable=SC2086
      ip6tables --wait --check $rule 2>/dev/null || ip6tables --wait --insert $rule
    fi
  elif command -v nft >/dev/null 2>&1; then
    # Made if missing, emptied, filled: the same table whatever was there before.
    nft -f - <<EOF
table inet pcflow_imds {}
flush table inet pcflow_imds
table inet pcflow_imds {
  chain output {
    type filter hook output priority filter; policy accept;
    meta skuid $uids ip daddr $imds reject
    meta skuid $uids ip6 daddr $imds6 reject
  }
}
EOF
  else
    fail "neither iptables nor nft is installed: the metadata service cannot be refused to $base_user"
  fi
}

metadata() { # metadata TOKEN PATH: this instance's metadata, asked with an IMDSv2 token
  curl --silent --fail --retry 3 --header "X-aws-ec2-metadata-token: $1" "http://$imds/latest/meta-data/$2" ||
    fail "no $2 from the instance metadata service"
}

limit_metadata_hops() {
  token=$(curl --silent --fail --retry 3 --request PUT --header "X-aws-ec2-metadata-token-ttl-seconds: 300" \
    "http://$imds/latest/api/token") || fail "no IMDSv2 token from $imds"
  instance=$(metadata "$token" instance-id)
  region=$(metadata "$token" placement/region)
  case ${instance#i-} in "$instance" | '' | *[!0-9a-f]*) fail "instance id '$instance' from IMDS is not one" ;; esac
  case $region in '' | *[!a-z0-9-]*) fail "region '$region' from IMDS is not one" ;; esac
  aws ec2 modify-instance-metadata-options --region "$region" --instance-id "$instance" \
    --http-tokens required --http-put-response-hop-limit 1 --output text >/dev/null ||
    fail "could not set IMDS hop limit 1 on $instance (the node role needs the admin's pcflow-cluster-node policy: docs/security.md)"
}

keep_for_boot() {
  pool=
  [ "$count" -eq 1 ] || pool=" $count"
  mkdir -p "$root/opt/pcflow" "$root/etc/systemd/system/multi-user.target.wants"
  [ "$0" = "$root$kept" ] || cp "$0" "$root$kept"
  chmod 0755 "$root$kept"
  cat >"$root/etc/systemd/system/$unit" <<EOF
[Unit]
Description=pcflow: jobs' account and their firewall to the instance metadata service
Wants=network-online.target
After=network-online.target

[Service]
Type=oneshot
ExecStart=/bin/sh $kept $base_user $base_uid $control_user$pool

[Install]
WantedBy=multi-user.target
EOF
  ln -sf "../$unit" "$root/etc/systemd/system/multi-user.target.wants/$unit"
}

index=0
while [ "$index" -lt "$count" ]; do # every account checked before any is made
  account "$index"
  check_account
  index=$((index + 1))
done
index=0
while [ "$index" -lt "$count" ]; do
  account "$index"
  ensure_account
  refuse_sudo_groups
  ensure_control_user_in_group
  index=$((index + 1))
done
block_imds
limit_metadata_hops
keep_for_boot
echo "pcflow node setup: jobs run as $base_user ($base_uid) and its $((count - 1)) others, the metadata service refused to them, hop limit 1"
