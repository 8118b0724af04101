#!/usr/bin/env bash
# docs/migration-from-polling.md's cut-over, run as written, with a real
# polling relay (bench/polling/relay.py, which deletes what it sent) and a
# writer that keeps writing the whole time: every event reaches Kafka, and
# duplicates only where the document says (rows committed after the slot's
# consistent point that the poller also sent before it stopped). The writer
# records each event in a business table in the same transaction, since the
# poller deletes the outbox rows.
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
# The application: an order and its event in one transaction, every 5 ms.
(
  while [[ ! -e $tmp/stop ]]; do
    for _ in $(seq 20); do
      echo "WITH e AS (INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'k' || (random() * 8)::int, 'OrderCreated', '{}') RETURNING id, seq) INSERT INTO orders SELECT id, seq FROM e;"
      echo "SELECT pg_sleep(0.005);"
    done
  done | psql -X -v ON_ERROR_STOP=1 -qAt -d $db >/dev/null
) &
writer=$!
"$venv/bin/python" "$REPO/bench/polling/relay.py" --dsn "host=$PGHOST port=$PGPORT user=postgres dbname=$db" \
  --bootstrap "$WALRELAY_TEST_KAFKA" --topic-prefix "$prefix" --idle-poll-s 0.2 >"$tmp/poller.log" 2>&1 &
poller=$!
for _ in $(seq 100); do [[ $(sql -d $db -c "SELECT count(*) >= 200 FROM orders") == t ]] && break; sleep 0.1; done
ok "the writer and the poller run"

# Step 2: the publication, then the slot, while the poller runs. Orders up
# to `before` were committed before the slot existed: only the poller sends
# them, exactly once.
before=$(sql -d $db -c "SELECT max(seq) FROM orders")
# The SQL of steps 2 and 3 is taken from the document itself.
python3 - "$REPO/docs/migration-from-polling.md" "$tmp" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
cut = text[text.index("## 2. Cut over"):]
blocks = re.findall(r"```sql\n(.*?)```", cut, re.S)
open(sys.argv[2] + "/step2.sql", "w").write(blocks[0].replace("\n   ", "\n"))
open(sys.argv[2] + "/step3.sql", "w").write(blocks[1].replace("\n   ", "\n"))
PY
grep -q pg_create_logical_replication_slot "$tmp/step2.sql" || fail "step 2 of the document creates no slot"
grep -q outbox_cutover "$tmp/step3.sql" || fail "step 3 of the document makes no cut-over list"
sql -d $db -f "$tmp/step2.sql" >/dev/null
# Step 3, right after: what the poller is still responsible for. (The
# document's query selects the unsent rows of a marking poller; this poller
# deletes, so every row still there is unsent.)
sed 's/ WHERE sent_at IS NULL//' "$tmp/step3.sql" | sql -d $db >/dev/null
# Step 4: until the poller has sent all of them.
for _ in $(seq 600); do
  [[ $(sql -d $db -c "SELECT count(*) FROM outbox JOIN outbox_cutover USING (id)") == 0 ]] && break
  sleep 0.1
done
[[ $(sql -d $db -c "SELECT count(*) FROM outbox JOIN outbox_cutover USING (id)") == 0 ]] || fail "the poller did not send the cut-over rows"
# Step 5: stop the poller.
kill -TERM "$poller"
wait "$poller" || fail "the poller failed: $(tail -n 5 "$tmp/poller.log")"
poller=
ok "steps 2 to 5: publication, slot, cut-over list, the poller drained it and stopped"
# Step 6: start walrelay.
cat > "$tmp/walrelay.properties" <<PROPS
database.hostname=$PGHOST
database.port=$PGPORT
database.user=walrelay
database.dbname=$db
publication.autocreate.mode=disabled
route.topic.replacement=$prefix.\${routedByValue}
kafka.bootstrap.servers=$WALRELAY_TEST_KAFKA
admin.listen=127.0.0.1:0
PROPS
start "$WALRELAY_DEPLOY_BINARY" --config "$tmp/walrelay.properties"
wait_streaming "step 6"
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
stop "step 6"
timeout 60 kcat -b "$WALRELAY_TEST_KAFKA" -C -t "$topic" -o beginning -e -q -f '%h\n' 2>/dev/null \
  | sed -n 's/.*\bid=\([0-9a-f-]*\).*/\1/p' | sort > "$tmp/sent"
sql -d $db -c "SELECT id, seq FROM orders ORDER BY id" > "$tmp/orders"
python3 - "$tmp/orders" "$tmp/sent" "$before" <<'PY'
import collections, sys
orders = dict(line.strip().split("|") for line in open(sys.argv[1]) if line.strip())
sent = collections.Counter(line.strip() for line in open(sys.argv[2]) if line.strip())
before = int(sys.argv[3])
missing = [i for i in orders if sent[i] == 0]
early_dups = [i for i in orders if int(orders[i]) <= before and sent[i] > 1]
dups = sum(c - 1 for c in sent.values() if c > 1)
print(f"orders={len(orders)} records={sum(sent.values())} missing={len(missing)} duplicates={dups} "
      f"duplicates committed before the slot={len(early_dups)}")
if not orders or missing or early_dups or set(sent) - set(orders):
    sys.exit(1)
PY
ok "every event in Kafka once or, if committed after the slot's creation, possibly twice"
