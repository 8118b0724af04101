#!/usr/bin/env bash
# docs/migration-from-polling.md's cut-over, run as written, with a real
# polling relay (bench/polling/relay.py, which deletes what it sent) and a
# writer that keeps writing the whole time: stop the poller, start walrelay
# with the initial snapshot; every event reaches Kafka exactly once. Then the
# page's rollback: the poller again, walrelay's slot dropped by the page's
# SQL; every event still reaches Kafka. The
# writer records each event in a business table in the same transaction,
# since the poller deletes the outbox rows.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
need_relay_services
make_tmp
# The benchmark's virtual environment: the poller's psycopg and confluent-kafka.
# (scripts/lib.sh's cache root, as bench/run.sh uses it)
venv=${WALRELAY_BENCH_VENV:-${WALRELAY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/walrelay}/bench-venv}
if ! "$venv/bin/python" -c 'import psycopg, confluent_kafka' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "psycopg[binary]>=3.1" "confluent-kafka>=2.3" >&2
fi
db=walrelay_migration
prefix=$(basename "$tmp" | tr -c 'a-zA-Z0-9\n' '_')
topic=$prefix.order
sql() { psql -X -v ON_ERROR_STOP=1 -qAt "$@"; }
writer='' poller='' pid=''
clean() {
  for p in $writer $poller $pid; do kill -KILL "$p" 2>/dev/null || true; done
  sql -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = 'walrelay'" >/dev/null
  sql -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "DROP ROLE IF EXISTS walrelay" >/dev/null
}
trap 'clean; rm -rf "$tmp"' EXIT
clean
sql -c "CREATE DATABASE $db" >/dev/null
sql -d $db >/dev/null <<'SQL'
CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), seq bigserial, aggregatetype text NOT NULL,
  aggregateid text NOT NULL, type text NOT NULL, payload jsonb);
CREATE TABLE orders (id uuid PRIMARY KEY, seq bigint NOT NULL);
CREATE ROLE walrelay LOGIN REPLICATION;
SQL
# The application: an order and its event in one transaction, every 5 ms,
# until $tmp/stop exists.
start_writer() {
  rm -f "$tmp/stop"
  (
    while [[ ! -e $tmp/stop ]]; do
      for _ in $(seq 20); do
        echo "WITH e AS (INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'k' || (random() * 8)::int, 'OrderCreated', '{}') RETURNING id, seq) INSERT INTO orders SELECT id, seq FROM e;"
        echo "SELECT pg_sleep(0.005);"
      done
    done | psql -X -v ON_ERROR_STOP=1 -qAt -d $db >/dev/null
  ) &
  writer=$!
}
start_poller() {
  "$venv/bin/python" "$REPO/bench/polling/relay.py" --dsn "host=$PGHOST port=$PGPORT user=postgres dbname=$db" \
    --bootstrap "$WALRELAY_TEST_KAFKA" --topic-prefix "$prefix" --idle-poll-s 0.2 >>"$tmp/poller.log" 2>&1 &
  poller=$!
}
start_writer
start_poller
for _ in $(seq 100); do [[ $(sql -d $db -c "SELECT count(*) >= 200 FROM orders") == t ]] && break; sleep 0.1; done
ok "the writer and the poller run"

# The cut-over as the document gives it: stop the poller, start walrelay with
# the snapshot (this poller deletes what it sent, so every row still in the
# table is unsent: no condition). The writer goes on the whole time.
kill -TERM "$poller"
wait "$poller" || fail "the poller failed: $(tail -n 5 "$tmp/poller.log")"
poller=
ok "the poller stopped with the writer running"
# walrelay's role: the publication's owner (it records the snapshot's
# progress there) and SELECT on the outbox (the snapshot reads it), as
# the document's step 1 says.
grep -q "GRANT SELECT ON" "$REPO/docs/migration-from-polling.md" || fail "the document does not say to grant SELECT"
sql -d $db >/dev/null <<'SQL'
CREATE PUBLICATION walrelay FOR TABLE outbox WITH (publish = 'insert');
ALTER PUBLICATION walrelay OWNER TO walrelay;
GRANT SELECT ON outbox TO walrelay;
SQL
# The document's keys, taken from it.
python3 - "$REPO/docs/migration-from-polling.md" > "$tmp/cutover.properties" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
cut = text[text.index("## 2. Cut over"):]
block = re.findall(r"```properties\n(.*?)```", cut, re.S)[0]
print("\n".join(l for l in block.splitlines() if l.strip() and not l.startswith("#")
                and not l.startswith("snapshot.select.statement.overrides")))
PY
grep -qx "snapshot.mode=initial" "$tmp/cutover.properties" || fail "the document's cut-over takes no snapshot"
cat > "$tmp/walrelay.properties" <<PROPS
database.hostname=$PGHOST
database.port=$PGPORT
database.user=walrelay
database.dbname=$db
publication.autocreate.mode=disabled
snapshot.order.column=seq
route.topic.replacement=$prefix.\${routedByValue}
kafka.bootstrap.servers=$WALRELAY_TEST_KAFKA
admin.listen=127.0.0.1:0
PROPS
cat "$tmp/cutover.properties" >> "$tmp/walrelay.properties"
start "$WALRELAY_DEPLOY_BINARY" --config "$tmp/walrelay.properties"
wait_streaming "the cut-over"
# The writer goes on for a while with walrelay alone, then stops.
sleep 3  # walrelay relaying alone: its length is the test
touch "$tmp/stop"
wait "$writer" || fail "the writer failed"
writer=
end=$(sql -d $db -c "SELECT pg_current_wal_lsn()")
for _ in $(seq 600); do
  [[ $(sql -c "SELECT confirmed_flush_lsn >= '$end' FROM pg_replication_slots WHERE slot_name = 'walrelay'") == t ]] && break
  sleep 0.1
done
stop "the cut-over"
timeout 60 kcat -b "$WALRELAY_TEST_KAFKA" -C -t "$topic" -o beginning -e -q -f '%h\n' 2>/dev/null \
  | sed -n 's/.*\bid=\([0-9a-f-]*\).*/\1/p' | sort > "$tmp/sent"
sql -d $db -c "SELECT id, seq FROM orders ORDER BY id" > "$tmp/orders"
python3 - "$tmp/orders" "$tmp/sent" <<'PY'
import collections, sys
orders = dict(line.strip().split("|") for line in open(sys.argv[1]) if line.strip())
sent = collections.Counter(line.strip() for line in open(sys.argv[2]) if line.strip())
missing = [i for i in orders if sent[i] == 0]
dups = sum(c - 1 for c in sent.values() if c > 1)
print(f"orders={len(orders)} records={sum(sent.values())} missing={len(missing)} duplicates={dups}")
if not orders or missing or dups or set(sent) - set(orders):
    sys.exit(1)
PY
ok "every event in Kafka exactly once: the poller's before the cut-over, the snapshot's and the stream's after"
# The order the page promises per key: the poller's (by seq), then the
# snapshot's (by snapshot.order.column, seq here: the ids are random uuids),
# then the stream's (commit order: one writer, so seq order too).
timeout 60 kcat -b "$WALRELAY_TEST_KAFKA" -C -t "$topic" -o beginning -e -q -f '%p %o %k %h\n' 2>/dev/null >"$tmp/records"
python3 - "$tmp/orders" "$tmp/records" <<'PY'
import re, sys
seq = dict(line.strip().split("|") for line in open(sys.argv[1]) if line.strip())
last, out_of_order, records = {}, [], 0
for line in sorted(open(sys.argv[2]), key=lambda l: (int(l.split()[0]), int(l.split()[1]))):
    key = line.split()[2]
    s = int(seq[re.search(r"\bid=([0-9a-f-]+)", line).group(1)])
    records += 1
    if key in last and s < last[key]:
        out_of_order.append((key, last[key], s))
    last[key] = max(s, last.get(key, 0))
print(f"records={records} keys={len(last)} out of order={len(out_of_order)} {out_of_order[:3]}")
sys.exit(1 if out_of_order or not records else 0)
PY
ok "per key, the records are in the order the page says"

# The rollback as the page gives it, the writer running: stop walrelay (it is
# stopped), start the poller, then the page's SQL drops walrelay's slot. Every
# event still reaches Kafka (those walrelay relayed may come twice).
rollback_from=$(sql -d $db -c "SELECT count(*) FROM orders")
start_writer
start_poller
drop_slot=$(python3 - "$REPO/docs/migration-from-polling.md" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
section = text[text.index("## 3. Rolling back"):]
print(re.search(r"`(SELECT pg_drop_replication_slot\([^`]*\);)`", section).group(1))
PY
)
sql -d $db -c "$drop_slot" >/dev/null || fail "the rollback's SQL failed: $drop_slot"
[[ $(sql -c "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'walrelay'") == 0 ]] \
  || fail "the rollback's SQL left walrelay's slot"
ok "the rollback's SQL dropped walrelay's slot: $drop_slot"
for _ in $(seq 100); do [[ $(sql -d $db -c "SELECT count(*) >= $rollback_from + 200 FROM orders") == t ]] && break; sleep 0.1; done
touch "$tmp/stop"
wait "$writer" || fail "the writer failed"
writer=
# The poller deletes what it sent: an empty outbox is a poller done.
for _ in $(seq 600); do [[ $(sql -d $db -c "SELECT count(*) FROM outbox") == 0 ]] && break; sleep 0.1; done
[[ $(sql -d $db -c "SELECT count(*) FROM outbox") == 0 ]] || fail "the poller did not send the outbox after the rollback"
timeout 60 kcat -b "$WALRELAY_TEST_KAFKA" -C -t "$topic" -o beginning -e -q -f '%h\n' 2>/dev/null \
  | sed -n 's/.*\bid=\([0-9a-f-]*\).*/\1/p' | sort -u > "$tmp/sent"
sql -d $db -c "SELECT id FROM orders ORDER BY id" > "$tmp/orders"
missing=$(comm -23 "$tmp/orders" "$tmp/sent" | wc -l)
((missing == 0)) || fail "after the rollback $missing events never reached Kafka"
ok "after the rollback every event reached Kafka ($(wc -l <"$tmp/orders") events, the poller's again included)"
