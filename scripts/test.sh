#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12 machine: installs what is missing,
# builds (warnings are errors), runs the unit tests once more under ASan and
# UBSan, starts PostgreSQL and Kafka, runs every test, and stops what it
# started, also when a test fails.
#
#   scripts/test.sh               everything: the whole suite on PostgreSQL 15, then on 14, 16, 17
#                                 and 18 the relay, admin, crash and database tests and the
#                                 high-availability tests each major supports
#   scripts/test.sh -L unit       one label (unit, integration, fault, fuzz, deploy, mutation), on 15
#
# WALRELAY_PG_MAJORS (default "14 16 17 18") names the other majors; empty skips them.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
start=$(date +%s)

other_majors=${WALRELAY_PG_MAJORS-14 16 17 18}
WALRELAY_PG_MAJORS="$other_majors" scripts/setup.sh
echo "==> build (warnings are errors)"
scripts/build.sh build -DWALRELAY_WERROR=ON
echo "==> build with AddressSanitizer + UndefinedBehaviorSanitizer (unit tests)"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DWALRELAY_SANITIZE=ON -DWALRELAY_WERROR=ON \
  -DWALRELAY_BENCH=OFF >/dev/null
cmake --build build-asan -j"$(nproc)" --target unit_tests decoder_tests

# Stop what we started, also when a test fails: the services, and any
# walrelay a crashed test binary left behind.
cleanup() {
  pkill -KILL -f 'walrelay --config /tmp/walrelay-test-' 2>/dev/null || true
  scripts/services.sh stop >/dev/null 2>&1 || true
}
trap cleanup EXIT
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
echo "==> unit tests under sanitizers"
ctest --test-dir build-asan -L unit --output-on-failure -j2
# PostgreSQL's and Kafka's data outlive a run: start from nothing, so that
# no earlier run's slots or topics can change this one's outcome.
scripts/services.sh clean >/dev/null 2>&1 || true
echo "==> all tests"
if [[ $# -gt 0 ]]; then
  ctest --test-dir build --output-on-failure "$@"
  echo "==> done in $(( $(date +%s) - start )) s"
  exit 0
fi
ctest --test-dir build --output-on-failure

# The other majors: what depends on the server (the relay, the admin
# endpoint's view of the slot, crashes, database faults), and the
# high-availability tests where the major has what they need. Each run
# starts that major (the services fixture passes PG_MAJOR on) and stops it.
version_tests='^(relay: |relay with a fake sink: |messages: |admin: |fault\.fault: (kill -9|PostgreSQL restarted|a walsender))'
ha_tests() {  # the hidden Catch tests a major runs
  local m=$1
  echo "failover: without a failover slot*"
  ((m >= 16)) && echo "failover: walrelay on a hot standby*"
  ((m >= 17)) && echo "failover: a failover slot survives*"
  return 0
}
for major in $other_majors 15; do
  echo "==> PostgreSQL $major"
  if [[ $major != 15 ]]; then
    PG_MAJOR=$major ctest --test-dir build --output-on-failure -R "$version_tests"
  fi
  PG_MAJOR=$major scripts/services.sh start >/dev/null 2>&1
  while IFS= read -r spec; do
    echo "    $spec"
    build/tests/integration_tests "$spec"
  done < <(ha_tests "$major")
  scripts/services.sh stop >/dev/null 2>&1
done
echo "==> done in $(( $(date +%s) - start )) s"
