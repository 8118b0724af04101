#!/usr/bin/env bash
# The main job, end to end: PostgreSQL and Kafka (local throwaway ones unless
# you configure your own), walrelay, and a writer that inserts an order and its
# outbox event in one transaction. The events are shown as they arrive in
# Kafka, read with kcat (an independent client).
#
# Your own servers: export WALRELAY_DATABASE_HOSTNAME, WALRELAY_DATABASE_PORT,
# WALRELAY_DATABASE_USER, WALRELAY_DATABASE_PASSWORD, WALRELAY_DATABASE_DBNAME
# and WALRELAY_KAFKA_BOOTSTRAP_SERVERS before running it.
# DEMO_EVENTS (default 10) sets how many orders the writer places.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
events="${DEMO_EVENTS:-10}"

"$repo/scripts/setup.sh"
echo "==> building walrelay" >&2
cmake -S "$repo" -B "$repo/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$repo/build" -j"$(nproc)" --target walrelay >/dev/null

started_services=0
if [[ -z "${WALRELAY_DATABASE_HOSTNAME:-}" || -z "${WALRELAY_KAFKA_BOOTSTRAP_SERVERS:-}" ]]; then
  echo "==> no WALRELAY_DATABASE_HOSTNAME / WALRELAY_KAFKA_BOOTSTRAP_SERVERS: starting a local PostgreSQL 15 and Kafka" >&2
  # Leave running what was already running (a developer's services).
  "$repo/scripts/services.sh" status >/dev/null 2>&1 || started_services=1
  "$repo/scripts/services.sh" start 2>/dev/null
  eval "$("$repo/scripts/services.sh" env)"
  export WALRELAY_DATABASE_HOSTNAME=$WALRELAY_TEST_PGHOST WALRELAY_DATABASE_PORT=$WALRELAY_TEST_PGPORT
  export WALRELAY_DATABASE_USER=$WALRELAY_TEST_PGUSER WALRELAY_DATABASE_DBNAME=$WALRELAY_TEST_PGDATABASE
  export WALRELAY_KAFKA_BOOTSTRAP_SERVERS=$WALRELAY_TEST_KAFKA
fi
export PGHOST=$WALRELAY_DATABASE_HOSTNAME PGPORT=${WALRELAY_DATABASE_PORT:-5432}
export PGUSER=${WALRELAY_DATABASE_USER:-postgres} PGDATABASE=${WALRELAY_DATABASE_DBNAME:-postgres}
export PGPASSWORD=${WALRELAY_DATABASE_PASSWORD:-}
broker=$WALRELAY_KAFKA_BOOTSTRAP_SERVERS
workdir=$(mktemp -d)
relay_pid=""
cleanup() {
  if [[ -n "$relay_pid" ]] && kill -TERM "$relay_pid" 2>/dev/null; then wait "$relay_pid" 2>/dev/null || true; fi
  if ((started_services)); then "$repo/scripts/services.sh" stop; fi
  rm -rf "$workdir"
}
trap cleanup EXIT

echo "==> creating the demo schema (orders + outbox)" >&2
psql -qX -v ON_ERROR_STOP=1 <<'SQL'
CREATE TABLE IF NOT EXISTS orders (
  id bigserial PRIMARY KEY, customer text NOT NULL, total numeric(10,2) NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS outbox (
  id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL,
  payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
SQL

cat > "$workdir/walrelay.properties" <<PROPS
# Everything else is Debezium's outbox default: table public.outbox,
# topic outbox.event.<aggregatetype>, key aggregateid, header id.
slot.name=walrelay_demo
publication.name=walrelay_demo
table.fields.additional.placement=type:header:eventType
admin.listen=127.0.0.1:0
log.level=info
PROPS
echo "==> starting walrelay" >&2
"$repo/build/walrelay" --config "$workdir/walrelay.properties" 2> "$workdir/walrelay.log" &
relay_pid=$!
for _ in $(seq 1 100); do
  grep -q "streaming:" "$workdir/walrelay.log" && break
  kill -0 "$relay_pid" 2>/dev/null || { cat "$workdir/walrelay.log" >&2; exit 1; }
  sleep 0.1
done
sed 's/^/    walrelay | /' "$workdir/walrelay.log" >&2

start_ms=$(($(date +%s%3N) - 1000))
echo "==> writer: $events orders, each with its OrderCreated event in the same transaction; one rolled back" >&2
for i in $(seq 1 "$events"); do
  psql -qX -v ON_ERROR_STOP=1 <<SQL
BEGIN;
WITH o AS (INSERT INTO orders (customer, total) VALUES ('customer-$((i % 3))', $i * 10.5) RETURNING id, customer, total)
INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
SELECT 'Order', o.id::text, 'OrderCreated', jsonb_build_object('orderId', o.id, 'customer', o.customer, 'total', o.total) FROM o;
COMMIT;
SQL
  if [[ $i -eq 3 ]]; then
    psql -qX <<'SQL'
BEGIN;
INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('Order', 'never', 'RolledBack', '{"visible": false}');
ROLLBACK;
SQL
  fi
done

echo "==> events in Kafka topic outbox.event.Order (read with kcat):" >&2
timeout 60 kcat -b "$broker" -C -t outbox.event.Order -o "s@$start_ms" -c "$events" -q \
  -f 'topic=%t partition=%p offset=%o key=%k headers=%h\n    value=%s\n'
sleep 1.5  # one status update interval, so the slot shows the confirmed position
echo "==> the slot on the server:" >&2
psql -X -c "SELECT slot_name, confirmed_flush_lsn, pg_current_wal_lsn() AS server_wal_lsn FROM pg_replication_slots WHERE slot_name = 'walrelay_demo'"
port=$(sed -n 's/.*admin endpoint listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$workdir/walrelay.log" | head -1)
if [[ -n "$port" ]] && command -v curl >/dev/null; then
  echo "==> GET /slot on the admin endpoint:" >&2
  curl -s "http://127.0.0.1:$port/slot"; echo
fi
