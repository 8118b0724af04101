#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12 machine: installs what is missing,
# builds (warnings are errors), runs the unit tests once more under ASan and
# UBSan, starts PostgreSQL and Kafka, runs every test, and stops what it
# started, also when a test fails.
#
#   scripts/test.sh               everything
#   scripts/test.sh -L unit       one label (unit, integration, fault, fuzz, deploy, mutation)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
start=$(date +%s)

scripts/setup.sh
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
else
  ctest --test-dir build --output-on-failure
fi
echo "==> done in $(( $(date +%s) - start )) s"
