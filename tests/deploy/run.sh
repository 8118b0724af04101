#!/usr/bin/env bash
# Runs the deployment tests: every tests/deploy/test_*.sh, in name order.
#
#   tests/deploy/run.sh [--strict] [path/to/walrelay]
#
# --strict (ctest uses it): a skipped test counts as failed, so that a test
# that cannot run is never mistaken for one that passed.
#
# The optional binary is used where a test can use a real one (the systemd
# unit check, the image's library list); without it, build/walrelay is used
# when it exists, and those parts are skipped otherwise.
#
# A test exits 0 (passed), 77 (skipped, with its reason on stderr) or anything
# else (failed). The last line is always `deploy: N passed, M failed`.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

strict=0
if [[ ${1:-} == --strict ]]; then strict=1; shift; fi
binary=${1:-}
if [[ -z $binary && -x $repo/build/walrelay ]]; then binary=$repo/build/walrelay; fi
if [[ -n $binary ]]; then binary=$(cd "$(dirname "$binary")" && pwd)/$(basename "$binary"); fi
export WALRELAY_DEPLOY_BINARY=$binary REPO=$repo

passed=0 failed=0 skipped=0
for t in "$here"/test_*.sh; do
  name=$(basename "$t" .sh)
  log=$(mktemp)
  "$t" >"$log" 2>&1
  rc=$?
  case $rc in
    0) passed=$((passed + 1)); echo "PASS $name" ;;
    77) skipped=$((skipped + 1)); echo "SKIP $name: $(tail -n 1 "$log")" ;;
    *) failed=$((failed + 1)); echo "FAIL $name (exit $rc)"; sed 's/^/    /' "$log" ;;
  esac
  rm -f "$log"
done
((skipped == 0)) || echo "($skipped skipped)"
((strict == 0)) || failed=$((failed + skipped))
echo "deploy: $passed passed, $failed failed"
((failed == 0))
