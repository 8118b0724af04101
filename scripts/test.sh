#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12 machine: installs what is missing
# (librdkafka 2.8.0 built once per machine), builds (warnings are errors),
# builds again with ASan and UBSan against Debian 12's librdkafka 2.0.2 and
# runs the unit tests there, starts PostgreSQL and Kafka, runs every test,
# and stops what it started, also when a test fails.
#
#   scripts/test.sh               everything: the whole suite on PostgreSQL 15 and librdkafka 2.8.0,
#                                 then relay and exactly-once tests against the 2.0.2 walrelay, then
#                                 on 14, 16, 17 and 18 the relay, admin, crash and database tests (those
#                                 that depend on the server's version)
#                                 and the high-availability tests each major supports
#   scripts/test.sh -L unit       one label (unit, integration, fault, fuzz, deploy, mutation), on 15
#
# WALRELAY_PG_MAJORS (default "14 16 17 18") names the other majors; empty skips them.
# WALRELAY_TEST_JOBS (default 4) is how many tests run at once (`ctest -j`): the
# integration tests mostly wait on the servers, and each works on objects of
# its own (tests/CMakeLists.txt says how the servers are shared).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
start=$(date +%s)

other_majors=${WALRELAY_PG_MAJORS-14 16 17 18}
jobs=${WALRELAY_TEST_JOBS:-4}
# The groups of servers the suite starts (tests/CMakeLists.txt): "" is the shared one.
service_groups=("" solo deploy campaign)
services_each() {  # services_each ARGS: scripts/services.sh ARGS for every group
  local g
  for g in "${service_groups[@]}"; do WALRELAY_SERVICES_GROUP=$g scripts/services.sh "$@" >/dev/null 2>&1 || true; done
}
# The walrelay of the 2.0.2 build runs these (Catch test specs).
rdkafka_202_tests=(
  "relay: every committed event*"
  "relay: per-key order holds*"
  "relay: the slot never passes an unacknowledged record*"
  "relay: kill -9 mid-run*"
  "fault: errors.tolerance=all sends a row*"
  "fault: exactly once - kill -9 ten times*"
  "fault: exactly once - a record the broker refuses aborts*"
  "fault: exactly once - two walrelays on one slot*"
)
WALRELAY_PG_MAJORS="$other_majors" scripts/setup.sh
echo "==> build (warnings are errors)"
# Without debug information (-g costs about a quarter of the compile time):
# crashes are caught with their stacks by the sanitizer build below.
scripts/build.sh build -DWALRELAY_WERROR=ON -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG"
build/walrelay --version
# librdkafka 2.0.2 stays supported: the sanitizer build is also the one
# against Debian 12's package, so one extra compile covers both. It is built
# in the background, at the lowest CPU priority, while the main suite runs:
# that suite mostly waits on the servers, so the compiler takes the idle CPU
# and the tests keep theirs (the build took about 6 min of the run before).
echo "==> build with AddressSanitizer + UndefinedBehaviorSanitizer, librdkafka 2.0.2 (Debian 12), in the background"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DWALRELAY_SANITIZE=ON -DWALRELAY_WERROR=ON \
  -DWALRELAY_BENCH=OFF -DWALRELAY_RDKAFKA_PREFIX=system >/dev/null
asan_log=$(mktemp /tmp/walrelay-asan-build-XXXXXX.log)
# A process group of its own, so that a stop takes the compilers with it.
setsid nice -n 19 cmake --build build-asan -j"$(nproc)" --target unit_tests decoder_tests walrelay >"$asan_log" 2>&1 &
asan_build=$!

# Stop what we started, also when a test fails: the services, any walrelay a
# crashed test binary left behind, and the background build.
cleanup() {
  kill -- -"$asan_build" 2>/dev/null || true
  pkill -KILL -f 'walrelay --config /tmp/walrelay-test-' 2>/dev/null || true
  services_each stop
}
trap cleanup EXIT
# The sanitizer build, waited for; its unit tests.
asan_unit_tests() {
  echo "==> waiting for the sanitizer build"
  if ! wait "$asan_build"; then
    tail -n 60 "$asan_log"
    echo "==> the sanitizer build failed (log: $asan_log)" >&2
    return 1
  fi
  build-asan/walrelay --version
  echo "==> unit tests under sanitizers, librdkafka 2.0.2"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan -L unit --output-on-failure -j2
}
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# PostgreSQL's and Kafka's data outlive a run: start from nothing, so that
# no earlier run's slots or topics can change this one's outcome.
services_each clean
echo "==> all tests, $jobs at once"
if [[ $# -gt 0 ]]; then
  ctest --test-dir build --output-on-failure -j"$jobs" "$@"
  asan_unit_tests
  echo "==> done in $(( $(date +%s) - start )) s"
  exit 0
fi
ctest --test-dir build --output-on-failure -j"$jobs"
asan_unit_tests

# librdkafka 2.0.2: the relay and exactly-once tests that run walrelay as a
# process, against the sanitizer build's walrelay (so they also run the
# daemon itself under ASan and UBSan), one at a time on the shared servers
# (one of them stops the broker), beside the other majors' lanes below.
((${#rdkafka_202_tests[@]})) || { echo "no librdkafka 2.0.2 tests listed" >&2; exit 1; }
rdkafka_202_run() {
  local spec
  echo "==> relay and exactly-once tests against walrelay on librdkafka 2.0.2 (ASan, UBSan)"
  scripts/services.sh start >/dev/null 2>&1 || { echo "could not start the services" >&2; return 1; }
  for spec in "${rdkafka_202_tests[@]}"; do
    echo "    $spec"
    WALRELAY_TEST_BINARY="$repo/build-asan/walrelay" build/tests/integration_tests --warn NoTests "$spec" ||
      { scripts/services.sh stop >/dev/null 2>&1; return 1; }
  done
  scripts/services.sh stop >/dev/null 2>&1
}

# The other majors: what depends on the server (the relay, the admin
# endpoint's view of the slot, crashes, database faults, the snapshot's
# COPY), and the
# high-availability tests where the major has what they need. Each run
# starts that major (the services fixture passes PG_MAJOR on) and stops it.
# The initial snapshot's COPY on a walsender connection and its SET LOCAL
# time-outs: two short tests.
version_tests='^(relay: |messages: |admin: |fault\.fault: (kill -9|PostgreSQL restarted|a walsender)|snapshot: (values that COPY|a role whose statement_timeout))'
# What does not depend on the server's version runs on 15 only: libpq's host
# resolution and reconnect delays, the broker's outages.
version_skip='^(relay: database\.hostname|relay: the database unreachable|relay: the slot never passes an unacknowledged|admin: lag grows while the broker)'
ha_tests() {  # the hidden Catch tests a major runs
  local m=$1
  echo "failover: without a failover slot*"
  ((m >= 16)) && echo "failover: walrelay on a hot standby*"
  ((m >= 17)) && echo "failover: a failover slot survives*"
  ((m >= 17)) && echo "failover: an asynchronous failover that loses relayed WAL*"
  return 0
}
# One major: its version tests (not on 15, which ran them all above) and
# its high-availability tests.
major_run() {
  local major=$1 spec
  echo "==> PostgreSQL $major"
  if [[ $major != 15 ]]; then
    PG_MAJOR=$major ctest --test-dir build --output-on-failure -j2 -R "$version_tests" -E "$version_skip" || return 1
  fi
  PG_MAJOR=$major scripts/services.sh start >/dev/null 2>&1 || { echo "could not start PostgreSQL $major" >&2; return 1; }
  while IFS= read -r spec; do
    echo "    $spec"
    build/tests/integration_tests --warn NoTests "$spec" || { scripts/services.sh stop >/dev/null 2>&1; return 1; }
  done < <(ha_tests "$major")
  scripts/services.sh stop >/dev/null 2>&1
}
# Two lanes at once, each with its own PostgreSQL and Kafka in a run
# directory of its own (services.sh's WALRELAY_RUN_DIR): these tests wait on
# the servers far more than they compute, and the stage took 4 x 115 s in a row.
lane_dirs=()
lane_cleanup() {
  local d
  for d in "${lane_dirs[@]}"; do
    WALRELAY_RUN_DIR=$d services_each clean
  done
}
trap 'cleanup; lane_cleanup' EXIT
read -r -a majors <<<"$other_majors 15"
lane_pids=()
rdkafka_202_run > >(sed -u "s/^/[2.0.2] /") 2>&1 &
lane_pids+=($!)
for lane in 0 1; do
  lane_majors=()
  for ((i = lane; i < ${#majors[@]}; i += 2)); do lane_majors+=("${majors[i]}"); done
  ((${#lane_majors[@]})) || continue
  dir=$(mktemp -d /tmp/walrelay-run-lane$lane-XXXXXX)
  lane_dirs+=("$dir")
  (
    export WALRELAY_RUN_DIR=$dir
    for major in "${lane_majors[@]}"; do major_run "$major" || exit 1; done
  ) > >(sed -u "s/^/[lane $lane] /") 2>&1 &
  lane_pids+=($!)
done
failed=0
for pid in "${lane_pids[@]}"; do wait "$pid" || failed=1; done
((failed == 0)) || { echo "==> librdkafka 2.0.2 or a PostgreSQL major failed (see the [2.0.2] and [lane N] lines above)" >&2; exit 1; }
echo "==> done in $(( $(date +%s) - start )) s"
