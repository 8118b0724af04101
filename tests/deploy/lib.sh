# Helpers shared by the tests/deploy tests (sourced, not run).
# shellcheck shell=bash

REPO=${REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
checks=0

# Prints a failure and exits 1.
fail() { echo "FAIL: $*" >&2; exit 1; }

# Prints the reason and exits 77 (skipped).
skip() { echo "skipped: $*" >&2; exit 77; }

# Fails unless a command exists, naming the Debian package that provides it.
need() {
  command -v "$1" >/dev/null 2>&1 || fail "$1 not found (Debian package: $2; add it to scripts/setup.sh)"
}

# Counts a check that passed and says what it was.
ok() { checks=$((checks + 1)); echo "ok: $*"; }

# Fails unless a file contains a fixed string.
contains() {
  grep -qF -- "$2" "$1" || fail "$1 does not contain: $2"
  ok "$(basename "$1") contains $2"
}

# Makes a temporary directory removed at exit.
make_tmp() {
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/walrelay-deploy.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
}
