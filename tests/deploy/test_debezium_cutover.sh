#!/usr/bin/env bash
# docs/migration-from-debezium.md's cut-over with a short overlap (3a) and its
# rollback, run from the page's own SQL with a writer running the whole time.
# Debezium's connector is played by pg_recvlogical reading its slot through
# its publication with pgoutput, as the connector does: what matters here is
# that each slot is made after its publication, so that pgoutput can decode
# every change from the slot's start (a slot made first fails with
# `publication "..." does not exist` at every reconnect and never moves).
# Checked: walrelay relays every event committed after X, up to its stop,
# with an independent reader (kcat); the rollback's slot is decoded and
# confirmed past the last write.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
need_relay_services
make_tmp
need pg_recvlogical postgresql-client-15
doc=$REPO/docs/migration-from-debezium.md
db=walrelay_dbz_cutover
prefix=$(basename "$tmp" | tr -c 'a-zA-Z0-9\n' '_')
topic=$prefix.order
sql() { psql -X -v ON_ERROR_STOP=1 -qAt "$@"; }
writer='' debezium='' pid=''
clean() {
  for p in $writer $debezium $pid; do kill -KILL "$p" 2>/dev/null || true; done
  sql -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = '$db'" >/dev/null 2>&1 || true
  sql -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null
}
trap 'clean; rm -rf "$tmp"' EXIT
clean

# The page's ```sql blocks of one section (between its heading and the next
# heading of the same or a higher level), one file each: $tmp/<tag>.<n>.sql.
blocks() {
  python3 - "$doc" "$1" "$tmp/$2" <<'PY'
import re, sys
text, heading, out = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3]
start = text.index(heading)
level = len(heading) - len(heading.lstrip("#"))
rest = text[start + len(heading):]
end = re.search(r"^#{1,%d} " % level, rest, re.M)
section = rest[: end.start()] if end else rest
found = re.findall(r"```sql\n(.*?)```", section, re.S)
for n, block in enumerate(found):
    open(f"{out}.{n}.sql", "w").write("\n".join(l.strip() for l in block.splitlines()) + "\n")
print(len(found))
PY
}
[[ $(blocks "### 2. Prepare" prepare) == 1 ]] || fail "Prepare does not give walrelay's publication as one SQL block"
[[ $(blocks "### 3a." cutover) == 3 ]] || fail "3a does not have its three SQL blocks"
[[ $(blocks "### Rolling back" rollback) == 3 ]] || fail "the rollback does not have its three SQL blocks"
# Waits until the page's wait query (X or Y put in) answers t.
wait_for() {
  local query=$1 what=$2
  for _ in $(seq 600); do
    [[ $(sql -d $db -f "$query") == t ]] && return 0
    sleep 0.1
  done
  fail "$what: not true within 60 s"
}
# Starts "Debezium" on a slot and publication: pg_recvlogical decoding with
# pgoutput, confirming what it wrote every second.
start_debezium() {
  pg_recvlogical -d "dbname=$db" --slot "$1" --start -o proto_version=1 -o "publication_names=$2" \
    -f "$tmp/$1.out" -F 1 -s 1 2>"$tmp/$1.err" &
  debezium=$!
}

sql -c "CREATE DATABASE $db" >/dev/null
sql -d $db >/dev/null <<'SQL'
CREATE TABLE public.outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), seq bigserial, aggregatetype text NOT NULL,
  aggregateid text NOT NULL, type text NOT NULL, payload jsonb);
CREATE PUBLICATION dbz_publication FOR TABLE public.outbox;
SELECT lsn FROM pg_create_logical_replication_slot('debezium', 'pgoutput');
SQL
start_debezium debezium dbz_publication
# The application: one event a transaction, every 5 ms.
(
  while [[ ! -e $tmp/stop ]]; do
    for _ in $(seq 20); do
      echo "INSERT INTO public.outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'k' || (random() * 8)::int, 'OrderCreated', '{}');"
      echo "SELECT pg_sleep(0.005);"
    done
  done | psql -X -v ON_ERROR_STOP=1 -qAt -d $db >/dev/null
) &
writer=$!
for _ in $(seq 100); do [[ $(sql -d $db -c "SELECT count(*) >= 200 FROM public.outbox") == t ]] && break; sleep 0.1; done
ok "the writer and Debezium's slot run"

# Prepare: walrelay's publication. 3a step 1: it exists, then the slot (X).
sql -d $db -f "$tmp/prepare.0.sql" >/dev/null
mapfile -t answer < <(sql -d $db -f "$tmp/cutover.0.sql")
[[ ${answer[0]:-} == walrelay ]] || fail "3a step 1: the publication check answered '${answer[0]:-}'"
x=${answer[1]:-}
[[ $x == */* ]] || fail "3a step 1: no LSN from the slot's creation: ${answer[*]}"
after_x=$(sql -d $db -c "SELECT max(seq) FROM public.outbox")  # every later seq committed after X
ok "3a step 1: walrelay's slot at X=$x"
# Step 2: Debezium has confirmed X.
sed "s#'X'#'$x'#" "$tmp/cutover.1.sql" >"$tmp/wait_x.sql"
wait_for "$tmp/wait_x.sql" "3a step 2 (Debezium's slot past X)"
ok "3a step 2: Debezium's slot confirmed past X"
# Step 3: Debezium stops. Step 4: walrelay starts and streams from X.
kill -TERM "$debezium"; wait "$debezium" || true; debezium=
cat > "$tmp/walrelay.properties" <<PROPS
database.hostname=$PGHOST
database.port=$PGPORT
database.user=postgres
database.dbname=$db
table.include.list=public.outbox
route.topic.replacement=$prefix.\${routedByValue}
kafka.bootstrap.servers=$WALRELAY_TEST_KAFKA
admin.listen=127.0.0.1:0
PROPS
start "$WALRELAY_DEPLOY_BINARY" --config "$tmp/walrelay.properties"
wait_streaming "3a step 4"
# Step 5: Debezium's slot and publication dropped.
sql -d $db -f "$tmp/cutover.2.sql" >/dev/null
ok "3a steps 3 to 5: Debezium stopped and dropped, walrelay streams"
sleep 2  # walrelay relaying alone: its length is the test

# The rollback: Debezium's publication, then its slot (Y), walrelay past Y.
mapfile -t answer < <(sql -d $db -f "$tmp/rollback.0.sql")
y=${answer[-1]:-}
[[ $y == */* ]] || fail "rollback step 1: no LSN from the slot's creation: ${answer[*]}"
before_y=$(sql -d $db -c "SELECT max(seq) FROM public.outbox")  # every seq up to it committed before Y
sed "s#'Y'#'$y'#" "$tmp/rollback.1.sql" >"$tmp/wait_y.sql"
wait_for "$tmp/wait_y.sql" "rollback step 2 (walrelay's slot past Y)"
stop "rollback step 3"
start_debezium debezium_rollback dbz_publication
ok "rollback steps 1 to 4: walrelay stopped past Y=$y, Debezium started on its new slot"
sleep 2
touch "$tmp/stop"
wait "$writer" || fail "the writer failed"
writer=
end=$(sql -d $db -c "SELECT pg_current_wal_lsn()")
for _ in $(seq 300); do
  [[ $(sql -c "SELECT confirmed_flush_lsn >= '$end' FROM pg_replication_slots WHERE slot_name = 'debezium_rollback'") == t ]] && break
  kill -0 "$debezium" 2>/dev/null || fail "Debezium's rollback slot: $(cat "$tmp/debezium_rollback.err")"
  sleep 0.1
done
[[ $(sql -c "SELECT confirmed_flush_lsn >= '$end' FROM pg_replication_slots WHERE slot_name = 'debezium_rollback'") == t ]] ||
  fail "Debezium's rollback slot was not decoded past the last write: $(cat "$tmp/debezium_rollback.err")"
[[ -s $tmp/debezium_rollback.out ]] || fail "Debezium's rollback slot gave nothing"
ok "Debezium's rollback slot decoded and confirmed past the last write"
sql -d $db -f "$tmp/rollback.2.sql" >/dev/null
ok "rollback step 5: walrelay's slot dropped"

# Every event committed after X and before Y is in Kafka (kcat reads it).
timeout 60 kcat -b "$WALRELAY_TEST_KAFKA" -C -t "$topic" -o beginning -e -q -f '%h\n' 2>/dev/null |
  sed -n 's/.*\bid=\([0-9a-f-]*\).*/\1/p' | sort -u >"$tmp/sent"
sql -d $db -c "SELECT id FROM public.outbox WHERE seq > $after_x AND seq <= $before_y ORDER BY id" >"$tmp/expected"
[[ -s $tmp/expected ]] || fail "no event between X and Y"
missing=$(comm -23 "$tmp/expected" "$tmp/sent" | wc -l)
echo "events between X and Y: $(wc -l <"$tmp/expected"); in Kafka: $(wc -l <"$tmp/sent"); missing: $missing"
((missing == 0)) || fail "$missing events committed between X and Y are not in Kafka"
ok "every event committed after X and before Y reached Kafka through walrelay"
