#!/usr/bin/env bash
# docs/operations.md's "PostgreSQL failover" before 17, run from the page's
# own commands: a streaming standby (scripts/services.sh standby, a
# pg_basebackup copy on another port), walrelay on the primary with both
# servers in database.hostname and a writer running; the primary is stopped
# hard and the standby promoted, the application writes on it at once.
# walrelay finds the promoted server, halts (staying up) and creates nothing; then the
# page's steps, in the page's order: --reset-slot, start walrelay, replay the
# gap. Checked with kcat: every event the new primary holds is in Kafka, and
# the gap was real (events missing before the replay step).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
need_relay_services
make_tmp
services=$REPO/scripts/services.sh
[[ -n ${WALRELAY_RUN_DIR:-} && $PGPORT == "$(cat "$WALRELAY_RUN_DIR/pg/port" 2>/dev/null)" ]] ||
  skip "the PostgreSQL is not scripts/services.sh's (the test stops it and promotes its standby)"
doc=$REPO/docs/operations.md
db=walrelay_failover
slot=walrelay_failover
primary_port=$PGPORT
prefix=$(basename "$tmp" | tr -c 'a-zA-Z0-9\n' '_')
topic=$prefix.order
sql() { psql -X -v ON_ERROR_STOP=1 -qAt "$@"; }
writer='' pid=''
clean() {
  for p in $writer $pid; do kill -KILL "$p" 2>/dev/null || true; done
  "$services" start pg >/dev/null 2>&1 || true   # the primary back, on its port
  "$services" standby stop fast >/dev/null 2>&1 || true
  sql -p "$primary_port" -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '$slot'" >/dev/null 2>&1 || true
  sql -p "$primary_port" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
}
trap 'clean; rm -rf "$tmp"' EXIT
clean

# The section's steps: its ```sh blocks, one command a line, in order.
page_steps "$doc" "### PostgreSQL failover" "On PostgreSQL 17 and later" >"$tmp/steps"
grep -q -- "--reset-slot" "$tmp/steps" || fail "the failover section gives no --reset-slot step"
ok "the failover section's steps: $(tr '\n' ';' <"$tmp/steps")"

sql -c "CREATE DATABASE $db" >/dev/null
sql -d $db -c "CREATE TABLE public.outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
  aggregateid text NOT NULL, type text NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now())" >/dev/null
"$services" standby start >"$tmp/standby.log" 2>&1 || fail "no standby: $(cat "$tmp/standby.log")"
eval "$("$services" env)"
standby_port=${WALRELAY_TEST_STANDBY_PGPORT:?}
ok "a streaming standby on port $standby_port"

# The application: one event a transaction, every 5 ms, on the server of $1.
write() {
  (
    while [[ ! -e $tmp/stop ]]; do
      for _ in $(seq 20); do
        echo "INSERT INTO public.outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'k' || (random() * 8)::int, 'OrderCreated', '{}');"
        echo "SELECT pg_sleep(0.005);"
      done
    done | psql -X -v ON_ERROR_STOP=1 -qAt -p "$1" -d $db >/dev/null 2>&1
  ) &
  writer=$!
}
cat >"$tmp/walrelay.properties" <<PROPS
database.hostname=$PGHOST,$PGHOST
database.port=$primary_port,$standby_port
database.user=postgres
database.dbname=$db
slot.name=$slot
reconnect.backoff.max.ms=500
route.topic.replacement=$prefix.\${routedByValue}
kafka.bootstrap.servers=$WALRELAY_TEST_KAFKA
admin.listen=127.0.0.1:0
PROPS
start "$WALRELAY_DEPLOY_BINARY" --config "$tmp/walrelay.properties"
wait_streaming "before the failover"
write "$primary_port"
sleep 2  # walrelay relays the primary's events
ok "walrelay streams from the primary, the writer writes"

# The failover: the primary stops hard, the standby is promoted, the
# application writes on it at once. walrelay finds it and halts.
"$services" primary stop immediate >/dev/null
wait "$writer" || true; writer=
failed_over=$(date -u '+%F %T+00')
"$services" standby promote >/dev/null
write "$standby_port"
wait_halted_up "on the promoted server"
grep -q -- "--reset-slot" "$log" || { cat "$log" >&2; fail "walrelay's halt does not name --reset-slot"; }
[[ $(sql -p "$standby_port" -c "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '$slot'") == 0 ]] ||
  fail "walrelay created a slot on the promoted server"
# The slot marker's promise: however often it is restarted.
kill -TERM "$pid"
wait_exit
((rc == 3)) || { cat "$log" >&2; fail "on the promoted server the halted walrelay exited $rc on SIGTERM, not 3"; }
start "$WALRELAY_DEPLOY_BINARY" --config "$tmp/walrelay.properties"
wait_halted_up "restarted on the promoted server"
[[ $(sql -p "$standby_port" -c "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '$slot'") == 0 ]] ||
  fail "walrelay restarted created a slot on the promoted server"
for _ in $(seq 100); do [[ $(sql -p "$standby_port" -d $db -c "SELECT count(*) > 100 FROM public.outbox WHERE created_at > '$failed_over'") == t ]] && break; sleep 0.1; done
ok "after the failover walrelay halted and stayed up, naming --reset-slot, twice (exit 3 on SIGTERM between), and created nothing"

# The page's steps, in its order. A command that runs the daemon is started
# and must stream; the others must exit 0. The replay's time is a time
# before the failover (the page's example time replaced).
since=$(date -u -d "$failed_over - 10 seconds" '+%F %T+00')
stream_started=0 gap=-1 created="" reset_step=()
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
  step=" $step "
  if [[ $step == *" replay "* ]]; then
    # The page's --since 'date time': the two words of its example become one.
    mapfile -t words < <(replace_since "$since" "${words[@]}")
    # What is missing before the replay: the gap.
    touch "$tmp/stop"; wait "$writer" || true; writer=
    sleep 1
    timeout 60 kcat -b "$WALRELAY_TEST_KAFKA" -C -t "$topic" -o beginning -e -q -f '%h\n' 2>/dev/null |
      sed -n 's/.*\bid=\([0-9a-f-]*\).*/\1/p' | sort -u >"$tmp/sent"
    sql -p "$standby_port" -d $db -c "SELECT id FROM public.outbox ORDER BY id" >"$tmp/held"
    gap=$(comm -23 "$tmp/held" "$tmp/sent" | wc -l)
    "${words[@]}" >"$tmp/replay.log" 2>&1 || { cat "$tmp/replay.log" >&2; fail "the page's replay step failed"; }
    ok "the page's replay step sent the gap again ($gap events missing before it)"
  elif [[ $step == " systemctl stop walrelay " ]]; then
    stop_halted_step
  elif [[ $step == *" --reset-slot "* ]]; then
    "${words[@]}" >"$tmp/reset.log" 2>&1 || { cat "$tmp/reset.log" >&2; fail "the page's --reset-slot step failed"; }
    grep -q "reset by the operator: events committed after .* were not relayed" "$tmp/reset.log" ||
      { cat "$tmp/reset.log" >&2; fail "--reset-slot did not log the range it skipped"; }
    ok "the page's --reset-slot step: $(grep -o 'events committed after .*' "$tmp/reset.log")"
    created=$(sed -n 's#.* and before \([0-9A-F]*/[0-9A-F]*\) were not relayed.*#\1#p' "$tmp/reset.log")
    reset_step=("${words[@]}")
  elif [[ $step == " walrelay --config "* ]]; then
    start "${words[@]}"
    wait_streaming "the page's start step"
    stream_started=1
    sleep 1
    ok "the page's start step: walrelay streams from the new primary"
  else
    fail "a step the test does not know: $step"
  fi
done <"$tmp/steps"
((stream_started == 1)) || fail "the page never starts walrelay again"

# The writer has stopped; walrelay confirms past the last write, then stops.
touch "$tmp/stop"; [[ -z $writer ]] || { wait "$writer" || true; writer=; }
end=$(sql -p "$standby_port" -c "SELECT pg_current_wal_lsn()")
for _ in $(seq 300); do
  [[ $(sql -p "$standby_port" -c "SELECT confirmed_flush_lsn >= '$end' FROM pg_replication_slots WHERE slot_name = '$slot'") == t ]] && break
  sleep 0.1
done
stop "after the failover"
timeout 60 kcat -b "$WALRELAY_TEST_KAFKA" -C -t "$topic" -o beginning -e -q -f '%h\n' 2>/dev/null |
  sed -n 's/.*\bid=\([0-9a-f-]*\).*/\1/p' | sort -u >"$tmp/sent"
sql -p "$standby_port" -d $db -c "SELECT id FROM public.outbox ORDER BY id" >"$tmp/held"
missing=$(comm -23 "$tmp/held" "$tmp/sent" | wc -l)
echo "events on the new primary: $(wc -l <"$tmp/held"); in Kafka: $(wc -l <"$tmp/sent"); missing: $missing"
((missing == 0)) || fail "$missing events the new primary holds are not in Kafka"
ok "every event the new primary holds reached Kafka"
# The premise: the page's replay step had a gap to send.
((gap > 0)) || fail "the premise: no event was missing before the replay step (gap $gap): the test proved nothing of it"

# The slot marker section: the marker names the new slot in the page's form,
# and --reset-slot run again leaves the usable slot alone.
comment=$(sql -p "$standby_port" -d $db -c "SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = 'walrelay'")
python3 - "$doc" "$slot" "$created" "$comment" <<'PY'
import re, sys
doc, slot, created, comment = sys.argv[1:]
text = open(doc).read()
section = text[text.index("### The slot marker"):]
example = re.search(r"```\n(walrelay\.slot=.*?)\n```", section).group(1)
keys = [w.split("=")[0] for w in example.split()]
line = next((l for l in comment.splitlines() if l.startswith(f"walrelay.slot={slot} ")), "")
got = dict(w.split("=", 1) for w in line.split())
if [k for k in got if k in keys] != keys or got.get("created_lsn") != created:
    sys.exit(f"the marker {line!r} is not the page's {keys} with created_lsn={created}")
PY
ok "the publication's comment has the page's marker for the new slot (created_lsn=$created)"
"${reset_step[@]}" >"$tmp/reset2.log" 2>&1 || { cat "$tmp/reset2.log" >&2; fail "--reset-slot run again failed"; }
grep -q "nothing to reset" "$tmp/reset2.log" || { cat "$tmp/reset2.log" >&2; fail "--reset-slot run again did not leave the slot alone"; }
ok "--reset-slot run again: nothing to reset"
