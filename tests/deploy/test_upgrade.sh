#!/usr/bin/env bash
# docs/operations.md's "pg_upgrade from 16 or earlier", run from the page's
# own commands, with a dump and restore into a new cluster (initdb on another
# port) standing for pg_upgrade: both copy the publication and its comment,
# the slot marker, and neither keeps a logical slot (nothing here ships a
# pg_upgrade pair of majors). A writer runs, then the page's order: writes
# stopped, walrelay caught up by its metrics (walrelay_slot_lag_bytes near 0,
# walrelay_inflight_records 0) and stopped, the upgrade, the page's commands,
# then the writer on the new cluster. Checked with kcat: every event the new
# cluster holds is in Kafka.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
need_relay_services
make_tmp
pgbin=${WALRELAY_TEST_PGBIN:-/usr/lib/postgresql/15/bin}
[[ -x $pgbin/initdb && -x $pgbin/pg_ctl ]] || skip "no initdb or pg_ctl in $pgbin"
need pg_dump postgresql-client-15
doc=$REPO/docs/operations.md
db=walrelay_upgrade
slot=walrelay_upgrade
prefix=$(basename "$tmp" | tr -c 'a-zA-Z0-9\n' '_')
topic=$prefix.order
sql() { psql -X -v ON_ERROR_STOP=1 -qAt "$@"; }
new=$tmp/new
writer='' pid='' new_port=''
clean() {
  for p in $writer $pid; do kill -KILL "$p" 2>/dev/null || true; done
  [[ ! -f $new/postmaster.pid ]] || as_pg "$pgbin/pg_ctl" -D "$new" -m immediate -w stop >/dev/null 2>&1 || true
  sql -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '$slot'" >/dev/null 2>&1 || true
  sql -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null
}
trap 'clean; rm -rf "$tmp"' EXIT
clean
chmod 755 "$tmp"

# The bullet's steps: its ```sh blocks, one command a line, in order.
page_steps "$doc" "- \`pg_upgrade\` from 16 or earlier" $'\n- ' >"$tmp/steps"
grep -qx "walrelay --config walrelay.properties" "$tmp/steps" || fail "the upgrade steps never start walrelay"
ok "the upgrade steps: $(tr '\n' ';' <"$tmp/steps")"

sql -c "CREATE DATABASE $db" >/dev/null
sql -d $db -c "CREATE TABLE public.outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
  aggregateid text NOT NULL, type text NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now())" >/dev/null
# The application: one event a transaction, every 5 ms, on the server of $1.
write() {
  rm -f "$tmp/stop"
  (
    while [[ ! -e $tmp/stop ]]; do
      for _ in $(seq 20); do
        echo "INSERT INTO public.outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'k' || (random() * 8)::int, 'OrderCreated', '{}');"
        echo "SELECT pg_sleep(0.005);"
      done
    done | psql -X -v ON_ERROR_STOP=1 -qAt -p "$1" -d $db >/dev/null
  ) &
  writer=$!
}
stop_writer() { touch "$tmp/stop"; wait "$writer" || fail "the writer failed"; writer=; }
config() {
  cat >"$tmp/walrelay.properties" <<PROPS
database.hostname=$PGHOST
database.port=$1
database.user=postgres
database.dbname=$db
slot.name=$slot
route.topic.replacement=$prefix.\${routedByValue}
kafka.bootstrap.servers=$WALRELAY_TEST_KAFKA
admin.listen=127.0.0.1:0
PROPS
}
# A gauge from the running walrelay's /metrics.
metric() {
  local port
  port=$(sed -n 's/.*admin endpoint on .* (port \([0-9]*\)).*/\1/p' "$log" | head -1)
  python3 - "$port" "$1" <<'PY'
import sys, urllib.request
port, name = sys.argv[1:]
for line in urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode().splitlines():
    if line.startswith(name + " ") or line.startswith(name + "{"):
        print(int(float(line.split()[-1])))
        break
PY
}

config "$PGPORT"
start "$WALRELAY_DEPLOY_BINARY" --config "$tmp/walrelay.properties"
wait_streaming "before the upgrade"
write "$PGPORT"
sleep 2
# 1. Writes stop. 2. walrelay catches up, by its metrics, and stops.
stop_writer
for _ in $(seq 300); do
  lag=$(metric walrelay_slot_lag_bytes) inflight=$(metric walrelay_inflight_records)
  ((lag < 65536 && inflight == 0)) && break
  sleep 0.1
done
((lag < 65536 && inflight == 0)) || fail "walrelay did not catch up: lag $lag bytes, $inflight records in flight"
stop "before the upgrade"
ok "writes stopped, walrelay caught up (lag $lag bytes, $inflight in flight) and stopped"

# 3. The upgrade: a new cluster, the database dumped into it.
new_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -m 700 "$new"
touch "$new.log"
[[ $(id -u) -ne 0 ]] || chown postgres: "$new" "$new.log"
as_pg "$pgbin/initdb" -D "$new" -U postgres -A trust >"$tmp/initdb.log" 2>&1 || fail "initdb: $(cat "$tmp/initdb.log")"
as_pg tee -a "$new/postgresql.conf" >/dev/null <<CONF
port = $new_port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$new'
wal_level = logical
fsync = off
CONF
as_pg "$pgbin/pg_ctl" -D "$new" -l "$new.log" -w -t 60 start >/dev/null || fail "the new cluster does not start: $(tail -5 "$new.log")"
sql -p "$new_port" -c "CREATE DATABASE $db" >/dev/null
pg_dump -d $db | sql -p "$new_port" -d $db >/dev/null
[[ $(sql -p "$new_port" -d $db -c "SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = 'walrelay'") == *"walrelay.slot=$slot "* ]] ||
  fail "the premise: the slot marker did not come with the dump"
ok "the upgrade: a new cluster with the database, its publication and slot marker, and no slot"

# 4., 5. The page's commands, in its order; then the writers.
config "$new_port"
while read -r step; do
  words=()
  for w in $step; do
    case $w in
      walrelay) w=$WALRELAY_DEPLOY_BINARY ;;
      walrelay.properties) w=$tmp/walrelay.properties ;;
    esac
    words+=("$w")
  done
  if [[ $step == "walrelay --config "* ]]; then
    start "${words[@]}"
    wait_streaming "the page's start step"
    ok "the page's start step: walrelay streams from the new cluster"
  else
    "${words[@]}" >"$tmp/step.log" 2>&1 || { cat "$tmp/step.log" >&2; fail "the page's step failed: $step"; }
    ok "the page's step: $step"
  fi
done <"$tmp/steps"
write "$new_port"
sleep 2
stop_writer
end=$(sql -p "$new_port" -c "SELECT pg_current_wal_lsn()")
for _ in $(seq 300); do
  [[ $(sql -p "$new_port" -c "SELECT confirmed_flush_lsn >= '$end' FROM pg_replication_slots WHERE slot_name = '$slot'") == t ]] && break
  sleep 0.1
done
stop "after the upgrade"
timeout 60 kcat -b "$WALRELAY_TEST_KAFKA" -C -t "$topic" -o beginning -e -q -f '%h\n' 2>/dev/null |
  sed -n 's/.*\bid=\([0-9a-f-]*\).*/\1/p' | sort -u >"$tmp/sent"
sql -p "$new_port" -d $db -c "SELECT id FROM public.outbox ORDER BY id" >"$tmp/held"
missing=$(comm -23 "$tmp/held" "$tmp/sent" | wc -l)
after=$(sql -p "$new_port" -d $db -c "SELECT count(*) FROM public.outbox" )
echo "events in the new cluster: $after; in Kafka: $(wc -l <"$tmp/sent"); missing: $missing"
((missing == 0)) || fail "$missing events the new cluster holds are not in Kafka"
ok "every event, before the upgrade and after, reached Kafka"
