#!/usr/bin/env bash
# Captures golden pgoutput vectors from a throwaway PostgreSQL cluster.
#
#   tests/golden/capture.sh [case ...]     default: every tests/golden/*.sql
#
# For each case <name>.sql it creates a fresh database and a logical slot, runs
# the SQL, then reads the slot with pg_logical_slot_get_binary_changes and
# writes <name>.hex: one pgoutput message per line, lowercase hex.
#
# Header lines in the SQL choose the options:
#   -- proto_version: 1|2|3
#   -- options: binary streaming        (any of: binary streaming two_phase)
# "messages" is always on. two_phase also creates the slot with two_phase=true
# (PostgreSQL 15's SQL API only decodes prepared transactions that way).
#
# The cluster lives in a temporary directory, listens on 127.0.0.1 on a free
# port, and is stopped and removed on exit. Needs PostgreSQL 15 binaries
# (PG_BIN, default /usr/lib/postgresql/15/bin) and python3 (to find a port).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
PG_BIN="${PG_BIN:-/usr/lib/postgresql/15/bin}"

# Runs a command as the postgres user when we are root (PostgreSQL refuses root).
as_pg() {
  if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

tmp=$(mktemp -d /tmp/pgoutput-golden.XXXXXX)
if [[ $(id -u) -eq 0 ]]; then chown postgres: "$tmp"; fi
port=$(free_port)
data="$tmp/data"

cleanup() {
  as_pg "$PG_BIN/pg_ctl" -D "$data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT

as_pg "$PG_BIN/initdb" -D "$data" -A trust -U postgres --no-sync -E UTF8 --locale=C.UTF-8 >"$tmp/initdb.log" 2>&1 ||
  { cat "$tmp/initdb.log" >&2; exit 1; }
cat >>"$data/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$tmp'
wal_level = logical
max_replication_slots = 20
max_wal_senders = 10
logical_decoding_work_mem = 64kB
max_prepared_transactions = 10
fsync = off
full_page_writes = off
EOF
as_pg "$PG_BIN/pg_ctl" -D "$data" -l "$tmp/server.log" -w start >/dev/null ||
  { cat "$tmp/server.log" >&2; exit 1; }

psql_db() {  # psql_db <db> [psql args...]
  local db=$1
  shift
  as_pg "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -d "$db" "$@"
}

if [[ $# -gt 0 ]]; then
  cases=("$@")
else
  cases=()
  for f in "$here"/*.sql; do cases+=("$(basename "$f" .sql)"); done
fi

for name in "${cases[@]}"; do
  sql="$here/$name.sql"
  [[ -f $sql ]] || { echo "could not capture $name: no $sql" >&2; exit 1; }
  proto=$(sed -n 's/^-- proto_version: *\([0-9]\).*/\1/p' "$sql" | head -1)
  opts=$(sed -n 's/^-- options: *//p' "$sql" | head -1)
  [[ -n $proto ]] || { echo "could not capture $name: no '-- proto_version:' line" >&2; exit 1; }

  db="golden_${name}"
  psql_db postgres -c "CREATE DATABASE \"$db\""
  two_phase=false
  args="'proto_version', '$proto', 'publication_names', 'golden_pub', 'messages', 'true'"
  for o in $opts; do
    case $o in
      binary) args+=", 'binary', 'true'" ;;
      streaming) args+=", 'streaming', 'true'" ;;
      two_phase) args+=", 'two_phase', 'true'"; two_phase=true ;;
      *) echo "could not capture $name: unknown option $o" >&2; exit 1 ;;
    esac
  done
  psql_db "$db" -c "SELECT pg_create_logical_replication_slot('golden', 'pgoutput', false, $two_phase)" >/dev/null
  psql_db "$db" <"$sql" >/dev/null
  psql_db "$db" -At -c "SELECT encode(data, 'hex') FROM pg_logical_slot_get_binary_changes('golden', NULL, NULL, $args)" \
    >"$here/$name.hex.tmp"
  mv "$here/$name.hex.tmp" "$here/$name.hex"
  psql_db "$db" -c "SELECT pg_drop_replication_slot('golden')" >/dev/null
  echo "captured $name: $(wc -l <"$here/$name.hex") messages"
done
