#!/usr/bin/env bash
# deploy/systemd/walrelay.service: `systemd-analyze verify` accepts it, its
# hardening scores "OK" or better offline, and exits 2 and 3 are not restarted.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
need systemd-analyze systemd
make_tmp

unit=$REPO/deploy/systemd/walrelay.service
# verify checks that ExecStart's binary exists: point it at a real one.
exe=${WALRELAY_DEPLOY_BINARY:-/bin/true}
sed "s#/usr/local/bin/walrelay#$exe#g" "$unit" > "$tmp/walrelay.service"
out=$(systemd-analyze verify "$tmp/walrelay.service" 2>&1) || fail "systemd-analyze verify: $out"
# verify exits 0 on some warnings; none are expected from this unit.
[[ -z $out ]] || fail "systemd-analyze verify printed: $out"
ok "systemd-analyze verify (ExecStart=$exe)"

# Offline security analysis (systemd >= 250): overall exposure must stay at or
# below 2.0 (the unit scores 1.5 with systemd 252).
if systemd-analyze security --help 2>&1 | grep -q -- '--offline'; then
  sec=$(systemd-analyze security --offline=yes "$tmp/walrelay.service" 2>&1) || true
  score=$(sed -n 's/.*Overall exposure level for walrelay.service: \([0-9.]*\).*/\1/p' <<<"$sec")
  [[ -n $score ]] || fail "no exposure level in: $sec"
  awk -v s="$score" 'BEGIN { exit !(s <= 2.0) }' || fail "exposure level $score > 2.0"
  ok "systemd-analyze security: exposure $score"
fi

if ! grep -qE '^RestartPreventExitStatus=.*\b2\b' "$unit" || ! grep -qE '^RestartPreventExitStatus=.*\b3\b' "$unit"; then
  fail "RestartPreventExitStatus must hold 2 and 3"
fi
ok "exit 2 and 3 are not restarted"
contains "$unit" "Restart=on-failure"
contains "$unit" "ExecStart=/usr/local/bin/walrelay --config /etc/walrelay/walrelay.properties"
contains "$unit" "EnvironmentFile=-/etc/walrelay/walrelay.env"

# The stop timeout must exceed walrelay's default drain time (shutdown.timeout.ms=30000).
stop=$(sed -n 's/^TimeoutStopSec=\([0-9]*\)s\{0,1\}$/\1/p' "$unit")
[[ -n $stop && $stop -gt 30 ]] || fail "TimeoutStopSec ($stop) must exceed 30 s"
ok "TimeoutStopSec=${stop}s > shutdown.timeout.ms"
