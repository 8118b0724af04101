#!/usr/bin/env bash
# Runs shellcheck over the deployment scripts and these tests.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
need shellcheck shellcheck
shellcheck "$REPO/deploy/docker/entrypoint.sh" "$REPO/deploy/docker/healthcheck.sh" \
  || fail "shellcheck found problems in deploy/docker"
# From the tests' directory so that `source lib.sh` is followed.
(cd "$REPO/tests/deploy" && shellcheck -x ./*.sh) || fail "shellcheck found problems in tests/deploy"
ok "shellcheck"
