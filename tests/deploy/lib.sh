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

# Runs a PostgreSQL server command as postgres when run as root (PostgreSQL
# refuses to run as root).
as_pg() { if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }

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

# Prints the steps of a page: the ```sh blocks between the first `$2` and
# the next `$3` after it in the file `$1`, one command a line, in order,
# comments and blank lines left out.
page_steps() {
  python3 - "$@" <<'PY'
import re, sys
text, first, last = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3]
start = text.index(first)
end = text.index(last, start + 1)
for block in re.findall(r"```sh\n(.*?)```", text[start:end], re.S):
    for line in block.splitlines():
        line = line.split("#")[0].strip()
        if line:
            print(line)
PY
}

# Prints the words of a page's `walrelay replay` step ($2...), one a line,
# with its --since value (the page's example: 'date time', one or two
# words) replaced by $1.
replace_since() {
  python3 - "$@" <<'PY'
import sys
since, words = sys.argv[1], sys.argv[2:]
out, skip = [], 0
for n, w in enumerate(words):
    if skip: skip -= 1; continue
    if w == "--since":
        out += [w, since]; skip = 1 + (n + 2 < len(words) and not words[n + 2].startswith("-"))
    else:
        out.append(w)
print("\n".join(out))
PY
}

# A page's `systemctl stop walrelay`: SIGTERM, as systemd sends it, to the
# current run, a halted walrelay still up; fails unless it exits 3.
stop_halted_step() {
  if [[ -z $pid ]] || ! kill -0 "$pid" 2>/dev/null; then fail "the page's stop step: no halted walrelay running"; fi
  kill -TERM "$pid"
  wait_exit
  ((rc == 3)) || { cat "$log" >&2; fail "the page's stop step: the halted walrelay exited $rc, not 3"; }
  ok "the page's stop step: the halted walrelay exited 3"
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
