#!/usr/bin/env bash
# docs/operations.md's "Status, pause, resume and restart", run from the
# page's own steps against a live walrelay: each `walrelay ctl` line of the
# page, in order, with this walrelay's configuration file for the page's.
# Checked after each: pause - /status says PAUSED and a row written then is
# not relayed; status - it prints PAUSED; resume - that row arrives (kcat).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
need_relay_services
need kcat kcat
make_tmp
name=ctlpage_$(basename "$tmp" | tr -c 'a-zA-Z0-9\n' '_' | tr '[:upper:]' '[:lower:]')
table=public.$name
sql() { psql -X -v ON_ERROR_STOP=1 -qAt "$@"; }
pid=''
clean() {
  [[ -z $pid ]] || kill -KILL "$pid" 2>/dev/null || true
  sql -c "SELECT pg_drop_replication_slot('$name') FROM pg_replication_slots WHERE slot_name = '$name'" \
    >/dev/null 2>&1 || true
  sql -c "DROP TABLE IF EXISTS $table" -c "DROP PUBLICATION IF EXISTS $name" >/dev/null 2>&1 || true
}
trap 'clean; rm -rf "$tmp"' EXIT

sql -c "CREATE TABLE $table (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
  aggregateid text NOT NULL, type text NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now())" >/dev/null
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
config=$tmp/walrelay.properties
cat >"$config" <<EOF
database.hostname=$PGHOST
database.port=$PGPORT
database.user=postgres
database.dbname=$PGDATABASE
kafka.bootstrap.servers=$WALRELAY_TEST_KAFKA
slot.name=$name
publication.name=$name
table.include.list=$table
admin.listen=127.0.0.1:$port
admin.control.token=page-control-token
EOF
insert() { sql -c "INSERT INTO $table (aggregatetype, aggregateid, type, payload) VALUES ('$name', '$1', 'T', '{}')" >/dev/null; }
keys() { timeout 20 kcat -b "$WALRELAY_TEST_KAFKA" -C -t "outbox.event.$name" -o beginning -e -q -f '%k\n' 2>/dev/null | sort -u | tr '\n' ' '; }
state() { "$WALRELAY_DEPLOY_BINARY" ctl --config "$config" status | python3 -c 'import json, sys; print(json.load(sys.stdin)["connector"]["state"])'; }

start "$WALRELAY_DEPLOY_BINARY" --config "$config"
wait_streaming "control page"
insert before
for _ in $(seq 60); do [[ $(keys) == "before " ]] && break; sleep 0.5; done
[[ $(keys) == "before " ]] || fail "control page: the first row did not arrive (premise)"

mapfile -t steps < <(page_steps "$REPO/docs/operations.md" "## Status, pause, resume and restart" $'\n## ')
[[ ${#steps[@]} == 3 ]] || fail "the page has ${#steps[@]} walrelay ctl steps, not 3 (pause, status, resume)"
for step in "${steps[@]}"; do
  read -r -a words <<<"$step"
  [[ ${words[0]} == walrelay && ${words[1]} == ctl ]] || fail "the page's step is not walrelay ctl: $step"
  words[0]=$WALRELAY_DEPLOY_BINARY
  for i in "${!words[@]}"; do [[ ${words[i]} != /etc/walrelay/walrelay.properties ]] || words[i]=$config; done
  out=$("${words[@]}" 2>&1) || fail "the page's step '$step' failed: $out"
  case ${words[-1]} in
    pause)
      for _ in $(seq 100); do [[ $(state) == PAUSED ]] && break; sleep 0.1; done
      [[ $(state) == PAUSED ]] || fail "control page: not PAUSED after '$step'"
      insert during
      sleep 3
      [[ $(keys) == "before " ]] || fail "control page: a row written while paused arrived: $(keys)"
      ok "the page's pause: PAUSED, and a row written then waits" ;;
    status)
      [[ $out == *'"state":"PAUSED"'* ]] || fail "control page: '$step' printed $out"
      ok "the page's status: PAUSED" ;;
    resume)
      for _ in $(seq 60); do [[ $(keys) == "before during " ]] && break; sleep 0.5; done
      [[ $(keys) == "before during " ]] || fail "control page: after '$step' the topic holds '$(keys)'"
      ok "the page's resume: the row written while paused arrived (kcat)" ;;
    *) fail "control page: a step the test does not know: $step" ;;
  esac
done
stop "control page"
