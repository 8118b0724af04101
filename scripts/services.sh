#!/usr/bin/env bash
# Starts and stops the throwaway PostgreSQL 15 and single-node Kafka (KRaft)
# that the tests, the demo and the benchmarks use. Loopback only, free ports.
#
#   scripts/services.sh start [pg|kafka|all]   start (idempotent), write $RUN_DIR/env
#   scripts/services.sh stop  [pg|kafka|all]   stop what start started (idempotent)
#   scripts/services.sh env                    print the env file (source it)
#   scripts/services.sh kafka-stop|kafka-start broker only, keeping its data (fault tests)
#
# The run directory defaults to /tmp/walrelay-run-<hash of this checkout> so
# that the postgres user can reach it even when the checkout is under /root.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
RUN_DIR="${WALRELAY_RUN_DIR:-/tmp/walrelay-run-$(echo "$repo" | md5sum | cut -c1-8)}"
PG_BIN="${PG_BIN:-/usr/lib/postgresql/15/bin}"
export RUN_DIR
# shellcheck source=scripts/lib.sh
source "$here/lib.sh"

# Runs a command as the postgres user when we are root (PostgreSQL refuses root).
as_pg() {
  if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

pg_start() {
  local d="$RUN_DIR/pg"
  mkdir -p "$d"
  if [[ -f "$d/port" ]] && as_pg "$PG_BIN/pg_ctl" -D "$d/data" status >/dev/null 2>&1; then return 0; fi
  if [[ $(id -u) -eq 0 ]]; then chown postgres: "$d"; chmod 755 "$RUN_DIR"; fi
  if [[ ! -f "$d/data/PG_VERSION" ]]; then
    as_pg "$PG_BIN/initdb" -D "$d/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$d/initdb.log" 2>&1 \
      || { cat "$d/initdb.log" >&2; return 1; }
  fi
  local port; port=$(free_port)
  cat > "$d/data/walrelay.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$d'
wal_level = logical
max_replication_slots = 32
max_wal_senders = 32
max_prepared_transactions = 16
shared_preload_libraries = 'pg_stat_statements'
pg_stat_statements.track = all
track_counts = on
fsync = off
synchronous_commit = on
full_page_writes = off
logging_collector = off
log_min_messages = warning
wal_sender_timeout = 60s
CONF
  grep -q "include_if_exists = 'walrelay.conf'" "$d/data/postgresql.conf" \
    || echo "include_if_exists = 'walrelay.conf'" >> "$d/data/postgresql.conf"
  # trust for the local test users only, on loopback only
  cat > "$d/data/pg_hba.conf" <<HBA
local all         all                 trust
host  all         all   127.0.0.1/32  trust
host  replication all   127.0.0.1/32  trust
local replication all                 trust
HBA
  as_pg "$PG_BIN/pg_ctl" -D "$d/data" -l "$d/postgres.log" -w -t 60 start >/dev/null
  echo "$port" > "$d/port"
  as_pg "$PG_BIN/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -qAt \
    -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null
}

pg_stop() {
  local d="$RUN_DIR/pg"
  [[ -d "$d/data" ]] || return 0
  as_pg "$PG_BIN/pg_ctl" -D "$d/data" -m fast -w -t 60 stop >/dev/null 2>&1 || true
  rm -f "$d/port"
}

kafka_up() {
  local d="$RUN_DIR/kafka"
  if [[ -f "$d/pid" ]] && kill -0 "$(cat "$d/pid")" 2>/dev/null; then return 0; fi
  kafka_launch "$d" "-Xms256m -Xmx1g" "$(cat "$d/port")"
}

kafka_start() {
  local d="$RUN_DIR/kafka"
  mkdir -p "$d"
  if [[ -f "$d/pid" ]] && kill -0 "$(cat "$d/pid")" 2>/dev/null; then return 0; fi
  if [[ ! -f "$d/data/meta.properties" ]]; then
    local port cport; port=$(free_port); cport=$(free_port)
    echo "$port" > "$d/port"
    kafka_configure "$d" "$port" "$cport" PLAINTEXT "num.partitions=3
offsets.topic.num.partitions=3
log.flush.interval.messages=9223372036854775807"
  fi
  kafka_up
}

kafka_stop() { kafka_kill "$RUN_DIR/kafka"; }

write_env() {
  local env="$RUN_DIR/env"
  {
    echo "export WALRELAY_RUN_DIR='$RUN_DIR'"
    if [[ -f "$RUN_DIR/pg/port" ]]; then
      echo "export WALRELAY_TEST_PGHOST=127.0.0.1"
      echo "export WALRELAY_TEST_PGPORT=$(cat "$RUN_DIR/pg/port")"
      echo "export WALRELAY_TEST_PGUSER=postgres"
      echo "export WALRELAY_TEST_PGDATABASE=postgres"
      echo "export WALRELAY_TEST_PGDATA='$RUN_DIR/pg/data'"
    fi
    if [[ -f "$RUN_DIR/kafka/port" ]]; then
      echo "export WALRELAY_TEST_KAFKA=127.0.0.1:$(cat "$RUN_DIR/kafka/port")"
    fi
    echo "export WALRELAY_TEST_SCRIPTS='$here'"
  } > "$env.tmp"
  mv "$env.tmp" "$env"
}

what="${2:-all}"
case "${1:-}" in
  start)
    mkdir -p "$RUN_DIR"
    [[ $what == all || $what == pg ]] && pg_start
    [[ $what == all || $what == kafka ]] && kafka_start
    write_env
    sed -n 's/^export //p' "$RUN_DIR/env" >&2 ;;
  stop)
    [[ $what == all || $what == kafka ]] && kafka_stop
    [[ $what == all || $what == pg ]] && pg_stop
    true ;;
  kafka-stop) kafka_stop ;;
  kafka-start) kafka_up ;;
  pg-restart) as_pg "$PG_BIN/pg_ctl" -D "$RUN_DIR/pg/data" -m "${2:-fast}" -w -t 60 restart -l "$RUN_DIR/pg/postgres.log" >/dev/null ;;
  env) cat "$RUN_DIR/env" ;;
  status)  # exit 0 when both services run
    [[ -f "$RUN_DIR/pg/port" ]] && as_pg "$PG_BIN/pg_ctl" -D "$RUN_DIR/pg/data" status >/dev/null 2>&1 \
      && [[ -f "$RUN_DIR/kafka/pid" ]] && kill -0 "$(cat "$RUN_DIR/kafka/pid")" 2>/dev/null ;;
  clean) "$0" stop; rm -rf "$RUN_DIR" ;;
  *) echo "usage: $0 start|stop [pg|kafka|all] | env | status | kafka-stop | kafka-start | pg-restart [fast|immediate] | clean" >&2; exit 2 ;;
esac
