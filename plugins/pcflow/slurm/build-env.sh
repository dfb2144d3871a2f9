#!/bin/bash
# A run's Python environment on the cluster, built once per id and reused (pcflow.slurm.envs sends this
# script over SSH with every prepare, as it sends tree-record.sh with every check: no copy on the cluster
# is trusted). Runs as the SSH user, never as a job account: jobs read and run the environments, never
# write them.
#
#   build-env.sh <tree-record.sh text> <envs> <state> <id> <base python> <layered|isolated> <uv> \
#                <quota bytes> <in-use s> <lock wait s> <build timeout s> <requirements file> [uv's index options...]
#
# <envs>/<id>/ is the environment (0755, files 0644: other accounts read and run it); <state>/ (0700, the
# SSH user's only) holds the lock, each environment's last-used stamp and size, and uv's cache. Under the
# lock (flock on <state>/lock, which no job can open): the stamp of <id> is touched (this run uses it);
# an <id> that is complete (its integrity record written) is reused as it is; anything else left under
# that name, or a build's temporary directory, is removed and the environment is built into a private
# temporary directory, recorded (tree-record.sh write, the record check_environment verifies) and renamed
# into place in one step, so no reader ever sees half an environment. Then the least recently used
# environments are evicted while all of them together are above the quota, except <id> and every one used
# within <in-use s> (a run that prepared it may still be running).
#
# `layered`: the environment sees the base environment's packages (a .pth file naming the base's
# site-packages, after its own), and uv installs only what the base does not already hold at a version
# the requirements accept (it is shown the base's package metadata as installed); so torch from the image
# is not downloaded again, and a version the requirements pin otherwise wins over the base's (the
# environment's own site-packages come first). `isolated`: the base's interpreter only.
#
# Prints `reused <id>` or `built <id> <seconds>`, then `size <bytes>`, `evicted <id> <bytes>` a line and
# `over-quota <bytes> <quota>` when eviction could not get below it. Exit status 3: the requirements did
# not install (the end of uv's output printed, nothing left behind); 4: the lock was not free in time;
# 5: no builder (uv) at <uv>; other: the cluster failed.
set -u
umask 022
export LC_ALL=C
FAILED=3 BUSY=4 NO_BUILDER=5
BASE_MARK=PCFLOW_BASE # in the metadata of a base package copied for uv (layered)
[ $# -ge 12 ] || { echo "usage: build-env.sh <record script> <envs> <state> <id> <python> <base> <uv> <quota> <in-use s> <wait s> <timeout s> <requirements> [index options]" >&2 && exit 2; }
record_script=$1 envs=$2 state=$3 id=$4 base_python=$5 base=$6 uv=$7 quota=$8 in_use=$9 wait_s=${10} limit_s=${11}
requirements=${12}
shift 12
index=("$@")
final=$envs/$id
for name in $(compgen -e); do # where packages come from is the profile's: no UV_* of the head node's account
  case $name in UV_*) unset "$name" ;; esac
done

[ -x "$uv" ] || { echo "no-builder $uv" && exit $NO_BUILDER; }
mkdir -p -m 755 -- "$envs" && mkdir -p -m 700 -- "$state" "$state/used" "$state/size" && chmod 700 -- "$state" || exit 1
exec 9>>"$state/lock" || exit 1
flock -w "$wait_s" 9 || { echo "busy" && exit $BUSY; }
# The last-used stamp: this run uses it from now. Its content orders eviction to the nanosecond (FSx for
# Lustre keeps whole seconds of mtime, and two prepares within a second tied, broken by name); its mtime
# is what the in-use window is measured against.
date +%s.%N >"$state/used/$id" || exit 1

uv_run() { # uv as pcflow runs it: no user or project config, the state's cache; within the build's time limit
  local left=$((deadline - $(date +%s)))
  [ "$left" -gt 0 ] || { echo "the build timed out after $limit_s s" && return 1; }
  timeout --kill-after=30 "$left" "$uv" "$1" --no-config --cache-dir "$state/uv-cache" "${@:2}" && return
  local status=$?
  [ $status -ne 124 ] || echo "the build timed out after $limit_s s"
  return $status
}

layer() { # <env>: the base's site-packages after the environment's own, and the base's packages shown to uv
  local site base_site dir name
  site=$("$1/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))') || return 1
  "$base_python" -c 'import sysconfig; print("\n".join(dict.fromkeys(sysconfig.get_path(p) for p in ("purelib", "platlib"))))' \
    >"$site/_pcflow_base.pth" || return 1
  # uv sees only the environment's own site-packages: each base package's metadata is copied there (marked),
  # so uv takes it as installed, with its own dependencies (a CPU build of torch needs no CUDA packages). A
  # version the requirements pin otherwise replaces it; the marked copies left are removed after the install.
  while read -r base_site; do
    for dir in "$base_site"/*.dist-info; do
      [ -f "$dir/METADATA" ] || continue
      name=$(basename -- "$dir")
      mkdir -- "$site/$name" && cp -- "$dir/METADATA" "$site/$name/METADATA" && : >"$site/$name/$BASE_MARK" &&
        printf '%s/METADATA,,\n%s/%s,,\n%s/RECORD,,\n' "$name" "$name" "$BASE_MARK" "$name" >"$site/$name/RECORD" ||
        return 1
    done
  done <"$site/_pcflow_base.pth"
}

unlayer() { # <env>: the base's marked metadata copies removed (the base's own is what Python finds)
  local dir
  for dir in "$1"/lib/python*/site-packages/*.dist-info; do
    [ ! -e "$dir/$BASE_MARK" ] || rm -rf -- "$dir" || return 1
  done
}

install() { # <env>: the requirements into it (layered: what the base holds at a fitting version is not again)
  local env=$1
  [ "$base" = isolated ] || layer "$env" || return 1
  uv_run pip install --python "$env/bin/python" --link-mode copy "${index[@]}" -r "$work/requirements.txt" || return 1
  [ "$base" = isolated ] || unlayer "$env"
}

build() { # into $work/env: the venv, its packages, every module compiled, what it was made from, its record
  local env=$work/env
  uv_run venv --quiet --relocatable --python "$base_python" "$env" && install "$env" || return $FAILED
  mkdir -m 755 "$env/.pcflow-env" && cp -- "$work/requirements.txt" "$env/.pcflow-env/requirements.txt" &&
    uv_run pip freeze --python "$env/bin/python" >"$env/.pcflow-env/installed.txt" &&
    printf '%s\n' "$id" >"$env/.pcflow-env/id" || return 1
  "$env/bin/python" -m compileall -q -j 0 "$env" >/dev/null 2>&1 # a file that does not compile stays uncompiled
  chmod -R go-w -- "$env" && bash -c "$record_script" tree-record.sh write "$env" >/dev/null || return 1
}

used_at() { # the stamp's time (a stamp written before it held one: its mtime; no stamp: 0)
  local stamp
  stamp=$(head -c 32 -- "$state/used/$1" 2>/dev/null)
  [[ $stamp =~ ^[0-9]+\.[0-9]+$ ]] && echo "$stamp" || stat -c %Y -- "$state/used/$1" 2>/dev/null || echo 0
}

evict() { # least recently used first, while above the quota; never $id nor one used within $in_use seconds
  local total=0 now name size
  now=$(date +%s)
  for dir in "$envs"/*/; do
    name=$(basename -- "$dir")
    [ -f "$state/size/$name" ] || du -sb -- "$dir" | cut -f1 >"$state/size/$name"
    total=$((total + $(cat -- "$state/size/$name")))
  done
  [ "$total" -gt "$quota" ] || return 0
  for name in $(cd "$envs" && for d in */; do
    printf '%s %s\n' "$(used_at "${d%/}")" "${d%/}"
  done | LC_ALL=C sort -g | cut -d' ' -f2); do
    [ "$total" -gt "$quota" ] || break
    [ "$name" != "$id" ] && [ $((now - $(stat -c %Y -- "$state/used/$name" 2>/dev/null || echo 0))) -ge "$in_use" ] ||
      continue
    size=$(cat -- "$state/size/$name")
    mv -T -- "$envs/$name" "$envs/.evicted-$name-$$" && rm -rf -- "$envs/.evicted-$name-$$" || return 1
    rm -f -- "$state/used/$name" "$state/size/$name"
    total=$((total - size)) && echo "evicted $name $size"
  done
  [ "$total" -le "$quota" ] || echo "over-quota $total $quota"
}

# A build's leftovers (none runs now: each holds the lock), and an <id> left incomplete, are removed.
rm -rf -- "$envs"/.tmp-* "$envs"/.evicted-*
if [ -f "$final/.pcflow-record/marker" ] && [ -f "$final/.pcflow-env/id" ]; then
  echo "reused $id"
else
  rm -rf -- "$final"
  work=$(mktemp -d -- "$envs/.tmp-$id-XXXXXX") || exit 1 # 0700: private while it is built
  trap 'rm -rf -- "$work"' EXIT
  cp -- "$requirements" "$work/requirements.txt" || exit 1
  begun=$(date +%s.%N) deadline=$(($(date +%s) + limit_s))
  build >"$work/log" 2>&1
  status=$?
  if [ $status -ne 0 ]; then
    rm -f -- "$state/used/$id"
    echo failed && tail -c 3000 -- "$work/log"
    [ $status -eq $FAILED ] && exit $FAILED || exit 1
  fi
  mv -T -- "$work/env" "$final" || exit 1
  du -sb -- "$final" | cut -f1 >"$state/size/$id"
  echo "built $id $(awk -v begun="$begun" -v now="$(date +%s.%N)" 'BEGIN { printf "%.2f", now - begun }')"
fi
echo "size $(cat -- "$state/size/$id" 2>/dev/null || du -sb -- "$final" | cut -f1)"
evict
