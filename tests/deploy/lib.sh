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

# The test services' addresses (scripts/services.sh env), unless the caller
# has set them.
load_services() {
  if [[ -z ${WALRELAY_TEST_PGHOST:-} ]] && "$REPO/scripts/services.sh" status >/dev/null 2>&1; then
    eval "$("$REPO/scripts/services.sh" env)"
  fi
}

# For a test that runs walrelay against the test PostgreSQL and Kafka:
# skips without them or without a binary, and points psql at the server as
# the superuser.
need_relay_services() {
  load_services
  [[ -n ${WALRELAY_TEST_PGHOST:-} && -n ${WALRELAY_TEST_KAFKA:-} ]] || skip "no PostgreSQL and Kafka (scripts/services.sh start)"
  [[ -x ${WALRELAY_DEPLOY_BINARY:-} ]] || skip "no walrelay binary (build it first)"
  need psql postgresql-client-15
  need kcat kcat
  need python3 python3
  export PGHOST=$WALRELAY_TEST_PGHOST PGPORT=${WALRELAY_TEST_PGPORT:?} PGUSER=postgres PGDATABASE=postgres
  export PGOPTIONS="-c client_min_messages=warning"
}

# Makes a temporary directory removed at exit.
make_tmp() {
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/walrelay-deploy.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
}

# A walrelay run by a test (the command in "$@", in the background, its
# output in $log); pid holds its process, runs counts the runs. Needs make_tmp.
start() {
  log=$tmp/walrelay.$((++runs)).log
  "$@" >"$log" 2>&1 &
  pid=$!
}
runs=0

# Waits until the current run logs that it streams, or fails with its log.
wait_streaming() {
  for _ in $(seq 300); do
    grep -q "streaming: START_REPLICATION" "$log" && return 0
    kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; fail "$1: walrelay exited before streaming"; }
    sleep 0.1
  done
  cat "$log" >&2
  fail "$1: walrelay did not stream within 30 s"
}

# Waits until the current run has halted and stays up (halt.action=stay, the
# default): it logs so and still runs. Fails with its log otherwise.
wait_halted_up() {
  for _ in $(seq 300); do
    grep -q "halted, staying up" "$log" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if ! grep -q "halted, staying up" "$log" || ! kill -0 "$pid" 2>/dev/null; then
    cat "$log" >&2
    fail "$1: walrelay did not stay up halted"
  fi
}

# Stops the current run with SIGTERM; fails unless it exits 0.
stop() {
  kill -TERM "$pid"
  local rc=0
  wait "$pid" || rc=$?
  pid=
  ((rc == 0)) || { cat "$log" >&2; fail "$1: walrelay exited $rc on SIGTERM"; }
}

# Waits for the current run to exit; sets rc to its code (not a $(...):
# only this shell can wait for its child).
wait_exit() {
  rc=0
  for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  wait "$pid" || rc=$?
  pid=
}
