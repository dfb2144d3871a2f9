#!/bin/bash
# A directory tree's integrity record, and the checks of a tree against one. The same script writes the
# records (the image bake, include/ami/bootstrap.sh; include/payloads/install-payload-env.sh on this
# machine) and checks trees on the cluster (pcflow.slurm.trees sends it over SSH each time: the checks
# are pcflow's, never a copy the cluster could have changed), so writer and checker pick the same files.
#
#   tree-record.sh write <dir>              record <dir> in <dir>/.pcflow-record/
#   tree-record.sh check <dir> [<state>]    check <dir> against its record (an environment)
#   tree-record.sh compare <dir>            check <dir> against the sha256sum list on stdin (staged code)
#
# The record: files.sha256 (`sha256sum` of every regular file, sorted, paths relative to <dir>), links
# (`<path> -> <target>` of every symbolic link) and marker (`sha256sum` of those two files).
# `check` always verifies the marker and that no other user can change the tree: every entry owned by
# root or the checking user, none writable by group or others, nor any directory above it (unless
# sticky). It also hashes every file and compares the file set and the links ("full") unless <state>
# names this record and is newer than the last status change (ctime, which no user can set back) of
# every entry. `compare` is the full check against the list it is given, and allows nothing but
# regular files and directories.
#
# Prints one finding a line, `<kind> <path>` (paths relative to <dir>, `.` for <dir> itself; directories
# above it absolute), at most $MAX_FINDINGS: absent, no-record, bad-record, owner, writable, special,
# missing, extra, changed, link. Then `check` prints `record <sha256 of the marker>`, `full` when it
# hashed every file and `started <epoch s>`. Exit status 0 when the check ran (findings or not).
set -u
export LC_ALL=C # sort, comm and find agree on byte order
RECORD=.pcflow-record
MAX_FINDINGS=${MAX_FINDINGS:-40}
me=$(id -u)

usage() {
  echo "usage: $0 write <dir> | check <dir> [<state>] | compare <dir> < list" >&2
  exit 2
}

files() { # the tree's regular files, relative, sorted, NUL-separated; "$@": find's leading tests (a prune)
  find . "$@" -type f -printf '%P\0' | sort -z
}

links() { # the tree's symbolic links (the record aside), `path -> target`, sorted
  find . -path "./$RECORD" -prune -o -type l -printf '%P -> %l\n' | sort
}

unsafe() { # what a user other than root or this one could change: the tree's entries and the directories above
  find . ! -type l \( -perm /022 -printf 'writable %P\n' -o ! -user 0 ! -user "$me" -printf 'owner %P\n' \) |
    sed 's/ $/ ./'
  local dir=$PWD
  while [ "$dir" != / ]; do
    dir=$(dirname -- "$dir")
    find "$dir" -maxdepth 0 \( -perm /022 ! -perm -1000 -printf 'writable %p\n' -o ! -user 0 ! -user "$me" \
      -printf 'owner %p\n' \)
  done
}

compare_files() { # <list> [find's leading tests]: the tree against a sha256sum list
  local list=$1
  shift
  cut -c 67- "$list" | sort >"$work/want"
  files "$@" | tr '\0' '\n' >"$work/have"
  comm -23 "$work/want" "$work/have" | sed 's/^/missing /'
  comm -13 "$work/want" "$work/have" | sed 's/^/extra /'
  sha256sum --check --quiet "$list" 2>/dev/null | sed -n 's/: FAILED$//p' | sed 's/^/changed /'
}

write() {
  cd -P -- "$1" || exit 1
  local found
  found=$(unsafe | head -n 5)
  [ -z "$found" ] || { echo "tree-record: other users could change $PWD: $found" >&2 && exit 1; }
  files -path "./$RECORD" -prune -o | xargs -0 -r sha256sum -- >"$work/files.sha256" || exit 1
  if grep -q '^\\' "$work/files.sha256"; then
    echo "tree-record: $PWD holds a file name with a backslash or a line break; not recorded" >&2 && exit 1
  fi
  links >"$work/links" && (cd "$work" && sha256sum files.sha256 links >marker) || exit 1
  rm -rf "$RECORD.new" && mkdir -m 755 "$RECORD.new" && cp "$work"/{files.sha256,links,marker} "$RECORD.new"/ &&
    chmod 444 "$RECORD.new"/* && rm -rf "$RECORD" && mv "$RECORD.new" "$RECORD" || exit 1
  echo "recorded $(wc -l <"$RECORD/files.sha256") files of $PWD: record $(sha256sum <"$RECORD/marker" | cut -c1-64)"
}

needs_full() { # <state> <record>: not verified in full since the record was written or anything changed
  [ -n "$1" ] && [ -f "$1" ] && [ "$(head -c 64 -- "$1")" = "$2" ] || return 0
  [ -n "$(find . -cnewer "$1" -print -quit)" ]
}

check() {
  local started record
  started=$(date -d '0.1 seconds ago' +%s.%N) # file times lag the clock by up to a tick: a margin of 0.1 s
  cd -P -- "$1" 2>/dev/null || { echo "absent ." && return; }
  [ -f "$RECORD/marker" ] || { echo "no-record $RECORD" && return; }
  (cd "$RECORD" && sha256sum --check --status --strict marker 2>/dev/null) || { echo "bad-record $RECORD" && return; }
  unsafe
  find . -path "./$RECORD" -prune -o ! -type f ! -type d ! -type l -printf 'special %P\n'
  record=$(sha256sum <"$RECORD/marker" | cut -c1-64)
  if needs_full "$2" "$record"; then
    compare_files "$RECORD/files.sha256" -path "./$RECORD" -prune -o
    links | comm -3 - "$RECORD/links" | sed 's/^\t/missing /; t; s/^/link /'
    echo full >>"$work/meta"
  fi
  printf 'record %s\nstarted %s\n' "$record" "$started" >>"$work/meta"
}

compare() {
  cd -P -- "$1" 2>/dev/null || { echo "absent ." && return; }
  unsafe
  find . ! -type f ! -type d -printf 'special %P\n'
  compare_files "$work/list"
}

work=$(mktemp -d) || exit 2
trap 'rm -rf "$work"' EXIT
case ${1:-} in
write) [ $# -eq 2 ] || usage && write "$2" ;;
check) [ $# -eq 2 ] || [ $# -eq 3 ] || usage && check "$2" "${3:-}" | head -n "$MAX_FINDINGS" ;;
compare) [ $# -eq 2 ] || usage && cat >"$work/list" && compare "$2" | head -n "$MAX_FINDINGS" ;;
*) usage ;;
esac
status=$?
[ ! -f "$work/meta" ] || cat "$work/meta"
exit "$status"
