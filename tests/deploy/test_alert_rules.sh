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
# Every rule has a test in which it fires (a rule added without one fails).
need python3 python3
missing=$(python3 - "$rules" "$(dirname "$0")/walrelay-alerts.test.yml" <<'PY'
import sys, yaml
rules = [r["alert"] for g in yaml.safe_load(open(sys.argv[1]))["groups"] for r in g["rules"]]
fired = {t["alertname"] for case in yaml.safe_load(open(sys.argv[2]))["tests"]
         for t in case.get("alert_rule_test", []) if t.get("exp_alerts")}
print(" ".join(r for r in rules if r not in fired))
PY
)
[[ -z $missing ]] || fail "alert rules without a promtool test in which they fire: $missing"
ok "every alert rule fires in a promtool test"
