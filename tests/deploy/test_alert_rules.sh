#!/usr/bin/env bash
# deploy/prometheus/walrelay-alerts.yml: promtool accepts the rules, and the
# unit tests in walrelay-alerts.test.yml fire (and do not fire) as expected.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
need promtool prometheus

rules=$REPO/deploy/prometheus/walrelay-alerts.yml
out=$(promtool check rules "$rules" 2>&1) || fail "promtool check rules: $out"
ok "promtool check rules: $(grep -o '[0-9]* rules found' <<<"$out")"
out=$(cd "$(dirname "$0")" && promtool test rules walrelay-alerts.test.yml 2>&1) || fail "promtool test rules: $out"
ok "promtool test rules"
