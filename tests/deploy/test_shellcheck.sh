#!/usr/bin/env bash
# Runs shellcheck over the deployment scripts, the project's scripts and these tests.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
need shellcheck shellcheck
shellcheck "$REPO/deploy/docker/entrypoint.sh" "$REPO/deploy/docker/healthcheck.sh" \
  || fail "shellcheck found problems in deploy/docker"
# From the tests' directory so that `source lib.sh` is followed.
(cd "$REPO/tests/deploy" && shellcheck -x ./*.sh) || fail "shellcheck found problems in tests/deploy"
# From the repository's root, where the scripts' `# shellcheck source=` paths start.
(cd "$REPO" && shellcheck -x scripts/*.sh scripts/fault/*.sh bench/run.sh bench/debezium/jars.sh \
  tests/golden/*.sh tests/fuzz/*.sh tests/mutation/*.sh .ci/run) || fail "shellcheck found problems in scripts/, bench/ or tests/"
ok "shellcheck"
