#!/usr/bin/env bash
# docs/operations.md's "After a restore or a failover" (exactly once), run
# from the page's own commands: walrelay relays with exactly.once.support=
# required and a writer running; a pg_basebackup is taken meanwhile, and the
# writer and walrelay go on past it. The database is then restored from the
# backup (started on another port: same system identifier, LSNs behind the
# committed position, no logical slot) and the application writes there at
# once. walrelay refuses to start (it halts and stays up); the page's steps run in the
# page's order. Checked with a read_committed kcat: every event the restored
# database holds is in Kafka, and the gap was real (events missing before the
# replay step).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
need_relay_services
make_tmp
pgbin=${WALRELAY_TEST_PGBIN:-/usr/lib/postgresql/15/bin}
major=${WALRELAY_TEST_PGMAJOR:-15}
basebackup=$pgbin/pg_basebackup
[[ -x $basebackup ]] || { ((major <= 15)) && basebackup=/usr/lib/postgresql/15/bin/pg_basebackup; }
[[ -x $basebackup && -x $pgbin/pg_ctl ]] || skip "no pg_basebackup or pg_ctl for PostgreSQL $major"
doc=$REPO/docs/operations.md
db=walrelay_restore
slot=walrelay_restore
prefix=$(basename "$tmp" | tr -c 'a-zA-Z0-9\n' '_')
topic=$prefix.order
sql() { psql -X -v ON_ERROR_STOP=1 -qAt "$@"; }
restored=$tmp/restored
writer='' pid='' restored_port=''
clean() {
  for p in $writer $pid; do kill -KILL "$p" 2>/dev/null || true; done
  [[ ! -f $restored/postmaster.pid ]] || as_pg "$pgbin/pg_ctl" -D "$restored" -m immediate -w stop >/dev/null 2>&1 || true
  sql -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '$slot'" >/dev/null 2>&1 || true
  sql -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null
}
trap 'clean; rm -rf "$tmp"' EXIT
clean
chmod 755 "$tmp"

# The paragraph's steps: its ```sh blocks, one command a line, in order.
page_steps "$doc" "**After a restore or a failover.**" $'\n**' >"$tmp/steps"
grep -q -- "--reset-offsets" "$tmp/steps" || fail "the restore steps give no --reset-offsets"
ok "the restore steps: $(tr '\n' ';' <"$tmp/steps")"

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
# The configuration for the server on port $1.
config() {
  cat >"$tmp/walrelay.properties" <<PROPS
database.hostname=$PGHOST
database.port=$1
database.user=postgres
database.dbname=$db
slot.name=$slot
exactly.once.support=required
offsets.storage.topic=$prefix.offsets
route.topic.replacement=$prefix.\${routedByValue}
kafka.bootstrap.servers=$WALRELAY_TEST_KAFKA
admin.listen=127.0.0.1:0
PROPS
}
# Every id in Kafka that a read_committed consumer sees, into $tmp/sent.
read_topic() {
  timeout 60 kcat -b "$WALRELAY_TEST_KAFKA" -X isolation.level=read_committed -C -t "$topic" -o beginning -e -q -f '%h\n' 2>/dev/null |
    sed -n 's/.*\bid=\([0-9a-f-]*\).*/\1/p' | sort -u >"$tmp/sent"
}

config "$PGPORT"
start "$WALRELAY_DEPLOY_BINARY" --config "$tmp/walrelay.properties"
wait_streaming "before the backup"
write "$PGPORT"
sleep 1
mkdir -m 700 "$restored"
touch "$restored.log"
[[ $(id -u) -ne 0 ]] || chown postgres: "$restored" "$restored.log"
as_pg "$basebackup" -D "$restored" -d "host=$PGHOST port=$PGPORT user=postgres" -X stream -c fast >"$tmp/backup.log" 2>&1 ||
  fail "pg_basebackup: $(cat "$tmp/backup.log")"
# The original goes on well past the backup's end: three WAL segments
# further, with the writer's events in each, so that the position walrelay
# commits lies past anything the restored database writes in this test.
for _ in 1 2 3; do
  sql -c "SELECT pg_switch_wal()" >/dev/null
  sleep 0.5
done
sleep 1
stop_writer
end=$(sql -c "SELECT pg_current_wal_lsn()")
for _ in $(seq 300); do
  [[ $(sql -c "SELECT confirmed_flush_lsn >= '$end' FROM pg_replication_slots WHERE slot_name = '$slot'") == t ]] && break
  sleep 0.1
done
stop "before the restore"
ok "walrelay relayed in exactly-once mode past a backup taken with writers running"

# The restore: the backup started as the database on another port, the
# application writing on it at once.
restored_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
as_pg tee -a "$restored/walrelay.conf" >/dev/null <<CONF
port = $restored_port
unix_socket_directories = '$restored'
CONF
as_pg "$pgbin/pg_ctl" -D "$restored" -l "$restored.log" -w -t 60 start >/dev/null || fail "the restored database does not start: $(tail -5 "$restored.log")"
restored_at=$(date -u '+%F %T+00')
write "$restored_port"
config "$restored_port"
start "$WALRELAY_DEPLOY_BINARY" --config "$tmp/walrelay.properties"
wait_halted_up "on the restored database"
[[ $(sql -p "$restored_port" -c "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '$slot'") == 0 ]] ||
  fail "walrelay created a slot on the restored database"
ok "on the restored database walrelay halts and stays up: $(grep -o 'halted: .\{0,120\}' "$log" | head -1)"
for _ in $(seq 100); do [[ $(sql -p "$restored_port" -d $db -c "SELECT count(*) > 100 FROM public.outbox WHERE created_at > '$restored_at'") == t ]] && break; sleep 0.1; done
[[ $(sql -p "$restored_port" -c "SELECT pg_current_wal_lsn() < '$end'") == t ]] ||
  fail "the premise: the restored database's WAL is not behind the position walrelay committed (before $end)"

# The page's steps, in its order. A command that runs the daemon is started
# and must stream; the others must exit 0. The replay's time: the restore's.
since=$(date -u -d "$restored_at - 10 seconds" '+%F %T+00')
stream_started=0 gap=-1
while read -r step; do
  words=()
  for w in $step; do
    w=${w//\'/}
    case $w in
      walrelay) w=$WALRELAY_DEPLOY_BINARY ;;
      walrelay.properties) w=$tmp/walrelay.properties ;;
    esac
    words+=("$w")
  done
  if [[ " $step " == *" replay "* ]]; then
    # The page's --since 'date time' (two words) becomes the test's time.
    mapfile -t words < <(replace_since "$since" "${words[@]}")
    stop_writer
    sleep 1
    read_topic
    sql -p "$restored_port" -d $db -c "SELECT id FROM public.outbox ORDER BY id" >"$tmp/held"
    gap=$(comm -23 "$tmp/held" "$tmp/sent" | wc -l)
    "${words[@]}" >"$tmp/replay.log" 2>&1 || { cat "$tmp/replay.log" >&2; fail "the page's replay step failed"; }
    ok "the page's replay step sent the gap again ($gap events missing before it)"
  elif [[ $step == "systemctl stop walrelay" ]]; then
    stop_halted_step
  elif [[ " $step " == *" --reset-slot "* || " $step " == *" --reset-offsets "* ]]; then
    "${words[@]}" >"$tmp/reset.log" 2>&1 || { cat "$tmp/reset.log" >&2; fail "the page's step failed: $step"; }
    ok "the page's step: $step"
  elif [[ $step == "walrelay --config "* ]]; then
    start "${words[@]}"
    wait_streaming "the page's start step"
    stream_started=1
    sleep 1
    ok "the page's start step: walrelay streams from the restored database"
  else
    fail "a step the test does not know: $step"
  fi
done <"$tmp/steps"
((stream_started == 1)) || fail "the page never starts walrelay again"

[[ -z $writer ]] || stop_writer
end=$(sql -p "$restored_port" -c "SELECT pg_current_wal_lsn()")
for _ in $(seq 300); do
  [[ $(sql -p "$restored_port" -c "SELECT confirmed_flush_lsn >= '$end' FROM pg_replication_slots WHERE slot_name = '$slot'") == t ]] && break
  sleep 0.1
done
stop "after the restore"
read_topic
sql -p "$restored_port" -d $db -c "SELECT id FROM public.outbox ORDER BY id" >"$tmp/held"
missing=$(comm -23 "$tmp/held" "$tmp/sent" | wc -l)
echo "events in the restored database: $(wc -l <"$tmp/held"); in Kafka (read_committed): $(wc -l <"$tmp/sent"); missing: $missing"
((missing == 0)) || fail "$missing events the restored database holds are not in Kafka"
ok "every event the restored database holds reached Kafka"
# The premise: the page's replay step had a gap to send.
((gap > 0)) || fail "the premise: no event was missing before the replay step (gap $gap): the test proved nothing of it"
