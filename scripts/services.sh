#!/usr/bin/env bash
# Starts and stops the throwaway PostgreSQL (15 by default) and single-node
# Kafka (KRaft) that the tests, the demo and the benchmarks use. Loopback
# only, free ports.
#
#   scripts/services.sh start [pg|kafka|all]   start (idempotent), write $RUN_DIR/env
#   scripts/services.sh stop  [pg|kafka|registry|nats|rabbitmq|redis|http|sqs|all]   stop what start started (idempotent; pg: the
#                                              standby too; all: the registry, NATS and RabbitMQ too)
#   scripts/services.sh start registry         an Apicurio Registry (not part of `all`), below
#   scripts/services.sh start nats             a nats-server with JetStream (not part of `all`), below
#   scripts/services.sh nats-stop|nats-start   NATS only, back on its port with its streams
#                                              (kept on disk: a broker restart or outage)
#   scripts/services.sh start rabbitmq         a RabbitMQ node (not part of `all`), below
#   scripts/services.sh rabbitmqctl ARGS...   rabbitmqctl against that node (users, permissions)
#   scripts/services.sh start redis            a redis-server with AOF (not part of `all`), below
#   scripts/services.sh redis-stop|redis-start   Redis only, back on its port with its data
#                                              (the AOF: a server restart or outage)
#   scripts/services.sh start http             tests/integration/http/receiver.py (not part of `all`): the
#                                              http sink's endpoint; WALRELAY_TEST_HTTP=127.0.0.1:<port>
#   scripts/services.sh http-stop|http-start   the receiver only, back on its port with its store
#   scripts/services.sh start sqs              an ElasticMQ server (not part of `all`), below
#   scripts/services.sh sqs-stop|sqs-start     ElasticMQ only, back on its port with its queues and messages
#   scripts/services.sh rabbitmq-stop|rabbitmq-start   RabbitMQ only, back on its port with its
#                                              durable exchanges and queues
#   scripts/services.sh env                    print the env file (source it)
#   scripts/services.sh kafka-stop|kafka-start broker only, keeping its data (fault tests)
#   scripts/services.sh registry-stop|registry-start   the registry only, back on its port (its
#                                              schemas are lost: it keeps them in memory)
#   scripts/services.sh pg-restart [fast|immediate]
#   scripts/services.sh standby start|promote|unsync|stop [fast|immediate]   a streaming physical standby
#   scripts/services.sh primary stop [fast|immediate]   the primary only (failover tests); `start pg`
#                                              brings it back on the same port
#
# PG_MAJOR (14..18, default 15) picks the PostgreSQL of `start pg`: 15 is
# Debian's, the others come from scripts/pg-install.sh (fetched on first use).
# One cluster runs at a time; each major keeps its own data directory, and
# starting another major stops the running one first. PG_BIN overrides the
# server's bin directory (PG_MAJOR then defaults to its version).
#
# `start registry` runs Apicurio Registry $APICURIO_VERSION (3.3.3 by default;
# in-memory storage) on loopback and a free port, with the Java 21+ of
# WALRELAY_REGISTRY_JAVA (default Temurin 25's). Its all-in-one tar.gz comes
# from Maven Central on first use and is unpacked once into
# $CACHE_ROOT/apicurio-registry-<version>. `env` then adds
# WALRELAY_TEST_REGISTRY, the base URL; its Confluent-compatible API is
# $WALRELAY_TEST_REGISTRY/apis/ccompat/v7. Log: $RUN_DIR/registry/registry.log.
#
# `start nats` runs Debian's nats-server (2.9) with JetStream, its store in
# $RUN_DIR/nats/store, on loopback and a free port; `env` then adds
# WALRELAY_TEST_NATS (nats://127.0.0.1:<port>). Log: $RUN_DIR/nats/nats.log.
#
# `start rabbitmq` runs Debian's RabbitMQ (3.10) as node walrelay-<port>@localhost,
# its data in $RUN_DIR/rabbitmq (RABBITMQ_MNESIA_BASE, its own Erlang cookie
# there as HOME), AMQP on loopback and a free port, epmd on loopback; `env`
# then adds WALRELAY_TEST_RABBITMQ (host:port; user guest, password guest,
# allowed beyond localhost by loopback_users = none only on 127.0.0.1).
#
# `start redis` runs Debian's redis-server (7.0) with its append-only file on
# (appendfsync always: what walrelay was told is stored survives a crash of
# the server), its data in $RUN_DIR/redis, on loopback and a free port; `env`
# then adds WALRELAY_TEST_REDIS (127.0.0.1:<port>). Log: $RUN_DIR/redis/redis.log.
#
# `start sqs` runs ElasticMQ $ELASTICMQ_VERSION (1.6.14 by default; an
# SQS-compatible server, from Maven Central on first use, in
# $CACHE_ROOT/elasticmq-<version>) on loopback and a free port, its queues
# and messages kept in $RUN_DIR/sqs/data (H2, written at each commit:
# a kill -9 keeps what it answered; no fsync, a machine crash may not); `env` then adds WALRELAY_TEST_SQS (http://127.0.0.1:<port>).
# With ELASTICMQ_STORAGE=memory it keeps them in memory only, with a heap of
# 2 GiB instead of 256 MiB and the JVM's full JIT (bench/run.sh: H2's commit per call bounded the
# benchmark at ~280 events/s, and 300,000 messages in a 256 MiB heap at ~300/s).
# It takes any credentials. Log: $RUN_DIR/sqs/elasticmq.log.
#
# The run directory defaults to /tmp/walrelay-run-<hash of this checkout> so
# that the postgres user can reach it even when the checkout is under /root.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
RUN_DIR="${WALRELAY_RUN_DIR:-/tmp/walrelay-run-$(echo "$repo" | md5sum | cut -c1-8)}"
# WALRELAY_SERVICES_GROUP names a second set of servers beside the first, in
# <run dir>-<group>: the tests that stop, freeze or reconfigure a server run
# on their own (ctest sets it; tests/CMakeLists.txt). A run dir that already
# names the group (from `env`, sourced) is taken as it is.
group=${WALRELAY_SERVICES_GROUP:-}
[[ -z $group || $RUN_DIR == *-"$group" ]] || RUN_DIR="$RUN_DIR-$group"
DEBIAN_PG_BIN=/usr/lib/postgresql/15/bin
if [[ -n ${PG_BIN:-} ]]; then
  PG_MAJOR="${PG_MAJOR:-$("$PG_BIN/postgres" --version | awk '{split($3, v, "."); print v[1]}')}"
fi
PG_MAJOR="${PG_MAJOR:-15}"
export RUN_DIR
# shellcheck source=scripts/lib.sh
source "$here/lib.sh"
STANDBY_SLOT=walrelay_standby

# Runs a command as the postgres user when we are root (PostgreSQL refuses root).
as_pg() {
  if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# The cluster of the run dir ($RUN_DIR/pg): `major` and `bin` name the one
# started last, `port` is there while it is meant to run. A run dir from
# before PG_MAJOR has neither file: that is Debian's 15.
cur_major() { cat "$RUN_DIR/pg/major" 2>/dev/null || echo 15; }
cur_bin() { cat "$RUN_DIR/pg/bin" 2>/dev/null || echo "$DEBIAN_PG_BIN"; }
# 15 keeps the data directory and log it always had.
pg_data_dir() { if [[ $1 == 15 ]]; then echo "$RUN_DIR/pg/data"; else echo "$RUN_DIR/pg/data-$1"; fi; }
pg_log() { if [[ $1 == 15 ]]; then echo "$RUN_DIR/pg/postgres.log"; else echo "$RUN_DIR/pg/postgres-$1.log"; fi; }

pg_running() {
  [[ -f "$RUN_DIR/pg/port" ]] && as_pg "$(cur_bin)/pg_ctl" -D "$(pg_data_dir "$(cur_major)")" status >/dev/null 2>&1
}

# psql of the running cluster's bin dir, else Debian's 15 (the npm builds
# ship no client; a psql talks to newer servers).
psql_bin() { if [[ -x "$(cur_bin)/psql" ]]; then cur_bin; else echo "$DEBIAN_PG_BIN"; fi; }
# sql PORT SQL...: runs statements as postgres on the cluster at PORT, prints tuples.
sql() {
  local port="$1"; shift
  local args=() s
  for s in "$@"; do args+=(-c "$s"); done
  PGOPTIONS="-c client_min_messages=warning" \
    as_pg "$(psql_bin)/psql" -X -h 127.0.0.1 -p "$port" -U postgres -d postgres -qAt -v ON_ERROR_STOP=1 "${args[@]}"
}

# Whether a server could listen on PORT (SO_REUSEADDR as PostgreSQL: a port
# in TIME_WAIT after a stop is free to it).
port_free() {
  python3 -c 'import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1",int(sys.argv[1]))); s.listen()' "$1" 2>/dev/null
}

# The bin directory of PG_MAJOR's server, installed when missing.
want_bin() {
  if [[ -n ${PG_BIN:-} ]]; then echo "$PG_BIN"; return; fi
  if [[ $PG_MAJOR == 15 ]]; then echo "$DEBIAN_PG_BIN"; return; fi
  "$here/pg-install.sh" "$PG_MAJOR" >&2 || return 1
  "$here/pg-install.sh" --bindir "$PG_MAJOR"
}

has_pg_stat_statements() {
  local bin="$1"
  [[ -f "$bin/../lib/postgresql/pg_stat_statements.so" || -f "$bin/../lib/pg_stat_statements.so" ]]
}

# pg_conf DATA PORT SOCKET_DIR BIN [EXTRA]: the settings of a test cluster,
# in DATA/walrelay.conf, included from its postgresql.conf.
pg_conf() {
  local data="$1" port="$2" sock="$3" bin="$4" extra="${5:-}" preload
  if has_pg_stat_statements "$bin"; then
    preload="shared_preload_libraries = 'pg_stat_statements'
pg_stat_statements.track = all"
  else
    preload="# no pg_stat_statements in $bin"
  fi
  cat > "$data/walrelay.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$sock'
wal_level = logical
max_replication_slots = 32
max_wal_senders = 32
max_prepared_transactions = 16
$preload
track_counts = on
fsync = off
synchronous_commit = on
full_page_writes = off
logging_collector = off
log_min_messages = warning
wal_sender_timeout = 60s
$extra
CONF
}

pg_start() {
  local d="$RUN_DIR/pg" major="$PG_MAJOR" bin data log
  bin=$(want_bin)
  mkdir -p "$d"
  if [[ $(cur_major) != "$major" ]]; then
    if pg_running || standby_running; then echo "services: stopping PostgreSQL $(cur_major) to start $major" >&2; fi
    pg_stop
  elif pg_running; then
    return 0
  fi
  echo "$major" > "$d/major"
  echo "$bin" > "$d/bin"
  data=$(pg_data_dir "$major"); log=$(pg_log "$major")
  if [[ $(id -u) -eq 0 ]]; then chown postgres: "$d"; chmod 755 "$RUN_DIR"; fi
  if [[ ! -f "$data/PG_VERSION" ]]; then
    as_pg "$bin/initdb" -D "$data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$d/initdb.log" 2>&1 \
      || { cat "$d/initdb.log" >&2; return 1; }
  fi
  # Back on the port it had when `primary stop` stopped it, so that the
  # connection facts a test already read stay true.
  local port=""
  if [[ -f "$d/port" ]] && port_free "$(cat "$d/port")"; then port=$(cat "$d/port"); fi
  [[ -n $port ]] || port=$(free_port)
  pg_conf "$data" "$port" "$d" "$bin"
  has_pg_stat_statements "$bin" || echo "services: PostgreSQL $major in $bin has no pg_stat_statements; left out" >&2
  # The primary's settings for a standby (empty while none runs), apart so
  # that the standby's copy can do without them.
  standby_running || primary_standby_conf ""
  local inc
  for inc in walrelay.conf walrelay-standby.conf; do
    grep -q "include_if_exists = '$inc'" "$data/postgresql.conf" \
      || echo "include_if_exists = '$inc'" >> "$data/postgresql.conf"
  done
  # trust for the local test users only, on loopback only
  cat > "$data/pg_hba.conf" <<HBA
local all         all                 trust
host  all         all   127.0.0.1/32  trust
host  replication all   127.0.0.1/32  trust
local replication all                 trust
HBA
  as_pg "$bin/pg_ctl" -D "$data" -l "$log" -w -t 60 start >/dev/null
  echo "$port" > "$d/port"
  if has_pg_stat_statements "$bin"; then
    sql "$port" "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null
  fi
  # Left over by a standby that went away with the primary down (failover tests).
  standby_running || drop_standby_slot
}

pg_stop() {
  local d="$RUN_DIR/pg" data
  standby_stop fast
  data=$(pg_data_dir "$(cur_major)")
  [[ -d "$data" ]] || return 0
  as_pg "$(cur_bin)/pg_ctl" -D "$data" -m fast -w -t 60 stop >/dev/null 2>&1 || true
  rm -f "$d/port"
}

# primary_stop MODE: the primary alone, keeping its port for `start pg`.
primary_stop() {
  [[ -f "$RUN_DIR/pg/port" ]] || { echo "services: no primary started" >&2; return 1; }
  as_pg "$(cur_bin)/pg_ctl" -D "$(pg_data_dir "$(cur_major)")" -m "$1" -w -t 60 stop >/dev/null 2>&1 || true
}

# The standby: a physical copy of the running primary in $RUN_DIR/pg/standby,
# streaming through the physical slot walrelay_standby, made anew by each
# `standby start`. 16+ allow logical decoding on it; on 17+ it synchronizes
# the primary's failover slots, and the primary holds back logical decoding
# of those until the standby has the WAL (synchronized_standby_slots).
SB="$RUN_DIR/pg/standby"

# primary_standby_conf TEXT: the primary's walrelay-standby.conf, reloaded
# when it changed and the primary runs.
primary_standby_conf() {
  local f; f="$(pg_data_dir "$(cur_major)")/walrelay-standby.conf"
  [[ -d $(dirname "$f") ]] || return 0
  [[ ! -f $f || $(cat "$f") != "$1" ]] || return 0
  echo "$1" | as_pg tee "$f" >/dev/null
  ! pg_running || sql "$(cat "$RUN_DIR/pg/port")" "SELECT pg_reload_conf()" >/dev/null
}

standby_running() { [[ -f "$SB/port" ]] && as_pg "$(cur_bin)/pg_ctl" -D "$SB/data" status >/dev/null 2>&1; }

# A pg_basebackup that can copy this major: its own, or Debian's 15 for 15
# and older (pg_basebackup refuses newer servers). Empty when none.
basebackup_bin() {
  local major="$1" bin="$2"
  if [[ -x "$bin/pg_basebackup" ]]; then echo "$bin/pg_basebackup"
  elif ((major <= 15)); then echo "$DEBIAN_PG_BIN/pg_basebackup"; fi
}

# copy_cluster PORT SRC DST: a base backup with the SQL API (pg_backup_start
# and _stop, 15+) where no pg_basebackup fits: psql holds the backup open
# while tar copies the files, then writes the backup_label it returns. Leaves
# out what pg_basebackup leaves out. The WAL comes by streaming from the slot.
copy_cluster() {
  local port="$1" src="$2" dst="$3" x excludes=""
  for x in postmaster.pid postmaster.opts backup_label backup_label.old tablespace_map standby.signal \
    recovery.signal current_logfiles 'pg_wal/*' 'pg_replslot/*' 'pg_dynshmem/*' \
    'pg_notify/*' 'pg_serial/*' 'pg_snapshots/*' 'pg_stat_tmp/*' 'pg_subtrans/*' '*pgsql_tmp*' '*pg_internal.init'; do
    excludes+=" --exclude='./$x'"
  done
  cat > "$SB/backup.sql" <<SQL
\\set ON_ERROR_STOP on
SELECT pg_backup_start('$STANDBY_SLOT', true);
\\! tar -C '$src' $excludes --ignore-failed-read --warning=none -cf - . | tar -C '$dst' -xf -
SELECT labelfile FROM pg_backup_stop(false) \\g (format=unaligned tuples_only=on) '$dst/backup_label'
SQL
  as_pg "$(psql_bin)/psql" -X -h 127.0.0.1 -p "$port" -U postgres -d postgres -q -f "$SB/backup.sql" \
    >"$SB/backup.log" 2>&1 || { cat "$SB/backup.log" >&2; return 1; }
  [[ -f "$dst/global/pg_control" && -s "$dst/backup_label" ]] \
    || { echo "services: the copy of $src is incomplete" >&2; cat "$SB/backup.log" >&2; return 1; }
  as_pg mkdir -p "$dst/pg_wal/archive_status"
}

standby_start() {
  pg_running || { echo "services: no primary runs (scripts/services.sh start pg)" >&2; return 1; }
  standby_running && return 0
  standby_stop fast
  # A standby half made would leave its slot holding WAL and, on 17+, the
  # primary's failover slots waiting for it: undo on any failure below.
  trap 'standby_stop immediate' EXIT
  local major bin pport port data pdata conninfo bb
  major=$(cur_major); bin=$(cur_bin); pport=$(cat "$RUN_DIR/pg/port"); pdata=$(pg_data_dir "$major")
  data="$SB/data"
  rm -rf "$SB"; mkdir -p "$SB"
  [[ $(id -u) -ne 0 ]] || chown postgres: "$SB"
  # Reserves WAL from now on: the copy's WAL streams from it.
  sql "$pport" "SELECT pg_create_physical_replication_slot('$STANDBY_SLOT', true)" >/dev/null
  ((major < 17)) || primary_standby_conf "synchronized_standby_slots = '$STANDBY_SLOT'"
  conninfo="host=127.0.0.1 port=$pport user=postgres dbname=postgres application_name=$STANDBY_SLOT"
  bb=$(basebackup_bin "$major" "$bin")
  if [[ -n $bb ]]; then
    as_pg "$bb" -D "$data" -d "$conninfo" -X stream -S "$STANDBY_SLOT" -c fast >"$SB/backup.log" 2>&1 \
      || { cat "$SB/backup.log" >&2; return 1; }
  else
    as_pg mkdir -m 700 "$data"
    copy_cluster "$pport" "$pdata" "$data"
  fi
  # The settings of pg_basebackup -R, written here for both ways of copying
  # (and with dbname, which slot synchronization needs on 17+).
  port=$(free_port)
  local extra="hot_standby = on
hot_standby_feedback = on
primary_conninfo = '$conninfo'
primary_slot_name = '$STANDBY_SLOT'"
  ((major < 17)) || extra+="
sync_replication_slots = on"
  pg_conf "$data" "$port" "$SB" "$bin" "$extra"
  as_pg truncate -s 0 "$data/walrelay-standby.conf"
  as_pg touch "$data/standby.signal"
  as_pg "$bin/pg_ctl" -D "$data" -l "$SB/postgres.log" -w -t 120 start >/dev/null \
    || { tail -20 "$SB/postgres.log" >&2; return 1; }
  echo "$port" > "$SB/port"
  local streaming=0
  for _ in $(seq 1 120); do
    streaming=$(sql "$pport" "SELECT count(*) FROM pg_stat_replication WHERE application_name = '$STANDBY_SLOT' AND state = 'streaming'")
    [[ $streaming == 1 ]] && break
    sleep 0.5
  done
  [[ $streaming == 1 ]] || { echo "services: the standby does not stream after 60 s; see $SB/postgres.log" >&2; return 1; }
  trap - EXIT
}

standby_promote() {
  standby_running || { echo "services: no standby runs" >&2; return 1; }
  local port; port=$(cat "$SB/port")
  as_pg "$(cur_bin)/pg_ctl" -D "$SB/data" -w -t 60 promote >/dev/null
  # Out of recovery and handing out transaction ids: it takes writes.
  for _ in $(seq 1 120); do
    sql "$port" "SELECT pg_current_xact_id()" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "services: the promoted standby takes no writes after 60 s; see $SB/postgres.log" >&2
  return 1
}

# standby_stop MODE: stops it and, when the primary runs, drops its slot
# there and lifts synchronized_standby_slots (which would otherwise hold back
# failover slots forever).
standby_stop() {
  if [[ -f "$SB/data/PG_VERSION" ]]; then
    as_pg "$(cur_bin)/pg_ctl" -D "$SB/data" -m "$1" -w -t 60 stop >/dev/null 2>&1 || true
  fi
  rm -f "$SB/port"
  primary_standby_conf ""
  drop_standby_slot
}

# The standby's slot on the primary, if both are there: it would hold WAL
# forever once the standby is gone.
drop_standby_slot() {
  pg_running || return 0
  local pport; pport=$(cat "$RUN_DIR/pg/port")
  # The walsender may take a moment to notice that the standby is gone.
  for _ in $(seq 1 20); do
    [[ $(sql "$pport" "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '$STANDBY_SLOT'") == 0 ]] && return 0
    sql "$pport" "SELECT pg_drop_replication_slot('$STANDBY_SLOT')" >/dev/null 2>&1 || sleep 0.5
  done
  echo "services: could not drop the slot $STANDBY_SLOT on the primary" >&2
}

kafka_up() {
  local d="$RUN_DIR/kafka"
  if [[ -f "$d/pid" ]] && alive "$(cat "$d/pid")"; then return 0; fi
  kafka_launch "$d" "-Xms256m -Xmx1g" "$(cat "$d/port")"
}

kafka_start() {
  local d="$RUN_DIR/kafka"
  mkdir -p "$d"
  if [[ -f "$d/pid" ]] && alive "$(cat "$d/pid")"; then return 0; fi
  if [[ ! -f "$d/data/meta.properties" ]]; then
    local first port cport via via_upstream
    first=$(free_ports 4)  # four in a row from here
    port=$first cport=$((first + 1)) via=$((first + 2)) via_upstream=$((first + 3))
    echo "$port" > "$d/port"
    # A second listener, VIA, on $via_upstream but advertised at $via: a TCP
    # proxy listening there (the fault campaign's Toxiproxy) then carries a
    # client's every connection, the ones metadata names included. Nothing
    # listens on $via until such a proxy does; PLAINTEXT stays direct.
    echo "$via" > "$d/via_port"
    echo "$via_upstream" > "$d/via_upstream_port"
    kafka_configure "$d" "$port" "$cport" PLAINTEXT "num.partitions=3
offsets.topic.num.partitions=3
log.flush.interval.messages=9223372036854775807
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport,VIA://127.0.0.1:$via_upstream
advertised.listeners=PLAINTEXT://127.0.0.1:$port,VIA://127.0.0.1:$via
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,VIA:PLAINTEXT"
  fi
  kafka_up
}

kafka_stop() { kafka_kill "$RUN_DIR/kafka"; }

# Apicurio Registry: the unpacked app of APICURIO_VERSION, fetched and
# unpacked on first use; prints the folder that holds quarkus-run.jar.
APICURIO_VERSION="${APICURIO_VERSION:-3.3.3}"
REGISTRY_JAVA="${WALRELAY_REGISTRY_JAVA:-/usr/lib/jvm/temurin-25-jdk-amd64/bin/java}"
registry_home() {
  local dir="$CACHE_ROOT/apicurio-registry-$APICURIO_VERSION" tgz jar
  if [[ ! -f "$dir/app/.complete" ]]; then
    # The tar.gz alone: the app's POM lists its build's dependencies, all
    # inside the archive already.
    maven_fetch "$dir" apicurio-registry "    <dependency><groupId>io.apicurio</groupId>
      <artifactId>apicurio-registry-app</artifactId><version>$APICURIO_VERSION</version>
      <classifier>all</classifier><type>tar.gz</type>
      <exclusions><exclusion><groupId>*</groupId><artifactId>*</artifactId></exclusion></exclusions>
    </dependency>" || return 1
    tgz="$dir/libs/apicurio-registry-app-$APICURIO_VERSION-all.tar.gz"
    [[ -f $tgz ]] || { echo "services: $tgz missing; fetching again" >&2; rm -rf "$dir"; registry_home; return; }
    rm -rf "$dir/app"; mkdir -p "$dir/app"
    tar -xzf "$tgz" -C "$dir/app" || return 1
    # The unpacked app is what runs; a lost app fetches the archive again.
    rm -rf "$dir/libs" "$dir/.complete"
    touch "$dir/app/.complete"
  fi
  jar=$(find "$dir/app" -name quarkus-run.jar -print -quit)
  [[ -n $jar ]] || { echo "services: no quarkus-run.jar in $dir/app" >&2; return 1; }
  dirname "$jar"
}

registry_running() { [[ -f "$RUN_DIR/registry/pid" ]] && alive "$(cat "$RUN_DIR/registry/pid")"; }

# registry_start [keep-port]: keep-port comes back on the port of the
# registry stopped by `registry-stop` (an outage, for the fault tests; its
# in-memory schemas are gone).
registry_start() {
  local d="$RUN_DIR/registry" home port mport kept=""
  registry_running && return 0
  [[ ${1:-} == keep-port && -f "$d/port" ]] && kept=$(cat "$d/port")
  registry_stop "${1:-}"
  [[ -x $REGISTRY_JAVA ]] || { echo "services: no Java 21+ at $REGISTRY_JAVA (set WALRELAY_REGISTRY_JAVA)" >&2; return 1; }
  # One unpacking at a time: two groups' registries may start at once, and
  # an unpacking replaces the cached app.
  mkdir -p "$CACHE_ROOT"
  home=$(exec {lock}>"$CACHE_ROOT/.lock-apicurio"; flock "$lock"; registry_home)
  mkdir -p "$d"
  port=${kept:-$(free_port)}; mport=$(free_port)
  # From its run directory, so that nothing lands in the caller's. The
  # management interface (health, metrics) would listen on 0.0.0.0:9000.
  (
    cd "$d" || exit 1
    nohup "$REGISTRY_JAVA" -Xms32m -Xmx384m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true \
      -Dquarkus.http.host=127.0.0.1 -Dquarkus.http.port="$port" \
      -Dquarkus.management.host=127.0.0.1 -Dquarkus.management.port="$mport" \
      -jar "$home/quarkus-run.jar" </dev/null >"$d/registry.log" 2>&1 &
    echo $! > "$d/pid"
  )
  echo "$port" > "$d/port"
  local url="http://127.0.0.1:$port/apis/ccompat/v7/subjects"
  for _ in $(seq 1 240); do
    if [[ $(curl -s -o /dev/null -w '%{http_code}' "$url" 2>/dev/null) == 200 ]]; then return 0; fi
    if ! registry_running; then
      tail -50 "$d/registry.log" >&2; echo "services: the registry died; see $d/registry.log" >&2
      registry_stop; return 1
    fi
    sleep 0.5
  done
  tail -50 "$d/registry.log" >&2
  echo "services: the registry did not answer $url in 120 s; see $d/registry.log" >&2
  registry_stop
  return 1
}

# SIGTERM, up to 20 s to finish, then SIGKILL. `registry_stop keep-port`
# keeps its port and env line for registry_start keep-port.
registry_stop() {
  local d="$RUN_DIR/registry" pid
  if [[ -f "$d/pid" ]]; then
    pid=$(cat "$d/pid")
    if alive "$pid"; then
      kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 1 40); do alive "$pid" || break; sleep 0.5; done
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$d/pid"
  [[ ${1:-} == keep-port ]] && return 0
  rm -f "$d/port"
  # Its own line in the env file only: `stop` leaves the others' as they were.
  if [[ -f "$RUN_DIR/env" ]] && grep -q '^export WALRELAY_TEST_REGISTRY=' "$RUN_DIR/env"; then
    grep -v '^export WALRELAY_TEST_REGISTRY=' "$RUN_DIR/env" > "$RUN_DIR/env.tmp.$$" || true
    mv "$RUN_DIR/env.tmp.$$" "$RUN_DIR/env"
  fi
}

nats_running() { [[ -f "$RUN_DIR/nats/pid" ]] && alive "$(cat "$RUN_DIR/nats/pid")"; }

# nats_start [keep-port]: keep-port comes back on the port of the server
# stopped by `nats-stop`, with the streams it had.
nats_start() {
  local d="$RUN_DIR/nats" port kept=""
  nats_running && return 0
  command -v nats-server >/dev/null || { echo "services: no nats-server (scripts/setup.sh installs it)" >&2; return 1; }
  [[ ${1:-} == keep-port && -f "$d/port" ]] && kept=$(cat "$d/port")
  mkdir -p "$d/store"
  port=${kept:-$(free_port)}
  nohup nats-server -a 127.0.0.1 -p "$port" -js -sd "$d/store" -l "$d/nats.log" </dev/null >/dev/null 2>&1 &
  echo $! > "$d/pid"
  echo "$port" > "$d/port"
  for _ in $(seq 1 100); do
    # JetStream is up when the log says so (the port opens before).
    if grep -q "Server is ready" "$d/nats.log" 2>/dev/null && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      return 0
    fi
    nats_running || { tail -20 "$d/nats.log" >&2; echo "services: nats-server died; see $d/nats.log" >&2; return 1; }
    sleep 0.1
  done
  echo "services: nats-server did not start in 10 s; see $d/nats.log" >&2
  return 1
}

# daemon_stop NAME VAR [keep-port]: the server whose pid is in
# $RUN_DIR/NAME/pid, SIGTERM (a clean shutdown), then SIGKILL; without
# keep-port its directory goes, and its line (export VAR=) from the env file.
daemon_stop() {
  local d="$RUN_DIR/$1" var=$2 pid
  if [[ -f "$d/pid" ]]; then
    pid=$(cat "$d/pid")
    if alive "$pid"; then
      kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 1 100); do alive "$pid" || break; sleep 0.1; done
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$d/pid"
  [[ ${3:-} == keep-port ]] && return 0
  rm -rf "$d"
  if [[ -f "$RUN_DIR/env" ]] && grep -q "^export $var=" "$RUN_DIR/env"; then
    grep -v "^export $var=" "$RUN_DIR/env" > "$RUN_DIR/env.tmp.$$" || true
    mv "$RUN_DIR/env.tmp.$$" "$RUN_DIR/env"
  fi
}

# nats_stop [keep-port]
nats_stop() {
  rm -f "$RUN_DIR/nats/nats.log"
  daemon_stop nats WALRELAY_TEST_NATS "${1:-}"
}

redis_running() { [[ -f "$RUN_DIR/redis/pid" ]] && alive "$(cat "$RUN_DIR/redis/pid")"; }

# redis_start [keep-port]: keep-port comes back on the port of the server
# stopped by `redis-stop`, with its data (the AOF).
redis_start() {
  local d="$RUN_DIR/redis" port kept=""
  redis_running && return 0
  command -v redis-server >/dev/null || { echo "services: no redis-server (scripts/setup.sh installs it)" >&2; return 1; }
  [[ ${1:-} == keep-port && -f "$d/port" ]] && kept=$(cat "$d/port")
  mkdir -p "$d/data"
  port=${kept:-$(free_port)}
  redis-server --bind 127.0.0.1 --port "$port" --dir "$d/data" --appendonly yes --appendfsync always \
    --save "" --daemonize no --logfile "$d/redis.log" </dev/null >/dev/null 2>&1 &
  echo $! > "$d/pid"
  echo "$port" > "$d/port"
  for _ in $(seq 1 100); do
    if redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG; then return 0; fi
    redis_running || { tail -20 "$d/redis.log" >&2; echo "services: redis-server died; see $d/redis.log" >&2; return 1; }
    sleep 0.1
  done
  echo "services: redis-server did not start in 10 s; see $d/redis.log" >&2
  return 1
}

# redis_stop [keep-port]
redis_stop() { daemon_stop redis WALRELAY_TEST_REDIS "${1:-}"; }

http_running() { [[ -f "$RUN_DIR/http/pid" ]] && alive "$(cat "$RUN_DIR/http/pid")"; }

# http_start [keep-port]: tests/integration/http/receiver.py, the endpoint of
# walrelay's http sink in the tests (Python's standard library only), its
# store in $RUN_DIR/http/store; keep-port comes back on the port of the one
# stopped by `http-stop`, with its store.
http_start() {
  local d="$RUN_DIR/http" port kept=""
  http_running && return 0
  [[ ${1:-} == keep-port && -f "$d/port" ]] && kept=$(cat "$d/port")
  mkdir -p "$d/store"
  port=${kept:-$(free_port)}
  python3 "$here/../tests/integration/http/receiver.py" --port "$port" --store "$d/store" \
    </dev/null >"$d/receiver.log" 2>&1 &
  echo $! > "$d/pid"
  echo "$port" > "$d/port"
  for _ in $(seq 1 100); do
    if curl -sf -o /dev/null -I "http://127.0.0.1:$port/"; then return 0; fi
    http_running || { tail -20 "$d/receiver.log" >&2; echo "services: the HTTP receiver died; see $d/receiver.log" >&2; return 1; }
    sleep 0.1
  done
  echo "services: the HTTP receiver did not answer in 10 s; see $d/receiver.log" >&2
  return 1
}

# http_stop [keep-port]
http_stop() { daemon_stop http WALRELAY_TEST_HTTP "${1:-}"; }

ELASTICMQ_VERSION="${ELASTICMQ_VERSION:-1.6.14}"
sqs_running() { [[ -f "$RUN_DIR/sqs/pid" ]] && alive "$(cat "$RUN_DIR/sqs/pid")"; }

# sqs_start [keep-port]: keep-port comes back on the port of the server
# stopped by `sqs-stop`, with its queues and messages.
sqs_start() {
  local d="$RUN_DIR/sqs" home="$CACHE_ROOT/elasticmq-$ELASTICMQ_VERSION" port kept=""
  sqs_running && return 0
  mkdir -p "$CACHE_ROOT"
  ( exec {lock}>"$CACHE_ROOT/.lock-elasticmq"; flock "$lock"
    maven_fetch "$home" elasticmq "    <dependency><groupId>org.elasticmq</groupId>
      <artifactId>elasticmq-server_2.13</artifactId><version>$ELASTICMQ_VERSION</version></dependency>" ) || return 1
  [[ ${1:-} == keep-port && -f "$d/port" ]] && kept=$(cat "$d/port")
  mkdir -p "$d/data"
  port=${kept:-$(free_port)}
  cat > "$d/elasticmq.conf" <<CONF
include classpath("application.conf")
node-address { protocol = http, host = 127.0.0.1, port = $port, context-path = "" }
rest-sqs { enabled = true, bind-port = $port, bind-hostname = "127.0.0.1", sqs-limits = strict }
rest-stats { enabled = false }
CONF
  if [[ ${ELASTICMQ_STORAGE:-h2} != memory ]]; then
    cat >> "$d/elasticmq.conf" <<CONF
messages-storage { enabled = true, uri = "jdbc:h2:$d/data/messages;WRITE_DELAY=0" }
queues-storage { enabled = true, path = "$d/data/queues.conf" }
CONF
  fi
  (
    cd "$d" || exit 1
    # Small and quick to start for the tests; for the benchmark, room and the full JIT.
    jvm=(-Xms32m -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1)
    [[ ${ELASTICMQ_STORAGE:-h2} == memory ]] && jvm=(-Xms256m -Xmx2g)
    nohup java "${jvm[@]}" -Djava.awt.headless=true \
      -Dconfig.file="$d/elasticmq.conf" -cp "$home/libs/*" org.elasticmq.server.Main \
      </dev/null >"$d/elasticmq.log" 2>&1 &
    echo $! > "$d/pid"
  )
  echo "$port" > "$d/port"
  for _ in $(seq 1 240); do
    if curl -s -o /dev/null "http://127.0.0.1:$port/"; then return 0; fi
    sqs_running || { tail -20 "$d/elasticmq.log" >&2; echo "services: ElasticMQ died; see $d/elasticmq.log" >&2; return 1; }
    sleep 0.25
  done
  echo "services: ElasticMQ did not answer in 60 s; see $d/elasticmq.log" >&2
  return 1
}

# sqs_stop [keep-port]
sqs_stop() { daemon_stop sqs WALRELAY_TEST_SQS "${1:-}"; }

RABBIT_BIN=/usr/lib/rabbitmq/bin
rabbit_env() {
  local d="$RUN_DIR/rabbitmq" port; port=$(cat "$d/port")
  export HOME="$d" RABBITMQ_NODENAME="walrelay-$port@localhost" RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
    RABBITMQ_NODE_PORT="$port" RABBITMQ_DIST_PORT=$((port + 1)) RABBITMQ_MNESIA_BASE="$d/mnesia" \
    RABBITMQ_LOG_BASE="$d/log" RABBITMQ_ENABLED_PLUGINS_FILE="$d/enabled_plugins" \
    RABBITMQ_CONFIG_FILE="$d/rabbitmq" RABBITMQ_PID_FILE="$d/pid" ERL_EPMD_ADDRESS=127.0.0.1 \
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
}
rabbit_running() {
  [[ -f "$RUN_DIR/rabbitmq/pid" ]] && alive "$(cat "$RUN_DIR/rabbitmq/pid" 2>/dev/null)"
}

# rabbit_start [keep-port]: keep-port comes back on the port (and node name,
# so with the durable exchanges and queues) of the node `rabbitmq-stop` stopped.
rabbit_start() {
  local d="$RUN_DIR/rabbitmq" port
  rabbit_running && return 0
  [[ -x $RABBIT_BIN/rabbitmq-server ]] || { echo "services: no rabbitmq-server (scripts/setup.sh installs it)" >&2; return 1; }
  mkdir -p "$d"
  if [[ ${1:-} != keep-port || ! -f "$d/port" ]]; then
    # The node port and the next one (Erlang distribution) both free.
    port=$(free_ports 2)
    echo "$port" > "$d/port"
  fi
  echo "[]." > "$d/enabled_plugins"
  echo "loopback_users = none" > "$d/rabbitmq.conf"
  (
    rabbit_env
    cd "$d" || exit 1
    nohup "$RABBIT_BIN/rabbitmq-server" </dev/null >"$d/server.log" 2>&1 &
  )
  for _ in $(seq 1 120); do
    if (rabbit_env; "$RABBIT_BIN/rabbitmqctl" -n "$RABBITMQ_NODENAME" await_startup -t 1) >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  # The reason first (a supervisor report runs to many lines), then the tail.
  grep -h -m5 -iE "eaddrinuse|reason|failed to start" "$d/server.log" "$d/log"/*.log 2>/dev/null >&2
  tail -30 "$d/server.log" >&2
  echo "services: RabbitMQ did not start in 60 s; see $d/server.log" >&2
  return 1
}

rabbit_stop() {
  local d="$RUN_DIR/rabbitmq" pid
  if [[ -f "$d/port" ]]; then
    (rabbit_env; "$RABBIT_BIN/rabbitmqctl" -n "$RABBITMQ_NODENAME" stop) >/dev/null 2>&1 || true
    if [[ -f "$d/pid" ]]; then
      pid=$(cat "$d/pid" 2>/dev/null || true)
      if [[ -n $pid ]]; then
        for _ in $(seq 1 100); do alive "$pid" || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
      fi
    fi
  fi
  rm -f "$d/pid"
  [[ ${1:-} == keep-port ]] && return 0
  rm -rf "$d"
  if [[ -f "$RUN_DIR/env" ]] && grep -q '^export WALRELAY_TEST_RABBITMQ=' "$RUN_DIR/env"; then
    grep -v '^export WALRELAY_TEST_RABBITMQ=' "$RUN_DIR/env" > "$RUN_DIR/env.tmp.$$" || true
    mv "$RUN_DIR/env.tmp.$$" "$RUN_DIR/env"
  fi
}

write_env() {
  local env="$RUN_DIR/env"
  {
    echo "export WALRELAY_RUN_DIR='$RUN_DIR'"
    if [[ -f "$RUN_DIR/pg/port" ]]; then
      echo "export WALRELAY_TEST_PGHOST=127.0.0.1"
      echo "export WALRELAY_TEST_PGPORT=$(cat "$RUN_DIR/pg/port")"
      echo "export WALRELAY_TEST_PGUSER=postgres"
      echo "export WALRELAY_TEST_PGDATABASE=postgres"
      echo "export WALRELAY_TEST_PGDATA='$(pg_data_dir "$(cur_major)")'"
      echo "export WALRELAY_TEST_PGMAJOR=$(cur_major)"
      echo "export WALRELAY_TEST_PGBIN='$(cur_bin)'"
    fi
    if [[ -f "$SB/port" ]]; then
      echo "export WALRELAY_TEST_STANDBY_PGPORT=$(cat "$SB/port")"
      echo "export WALRELAY_TEST_STANDBY_PGDATA='$SB/data'"
    fi
    if [[ -f "$RUN_DIR/kafka/port" ]]; then
      echo "export WALRELAY_TEST_KAFKA=127.0.0.1:$(cat "$RUN_DIR/kafka/port")"
    fi
    if [[ -f "$RUN_DIR/kafka/via_port" ]]; then
      echo "export WALRELAY_TEST_KAFKA_VIA=127.0.0.1:$(cat "$RUN_DIR/kafka/via_port")"
      echo "export WALRELAY_TEST_KAFKA_VIA_UPSTREAM=127.0.0.1:$(cat "$RUN_DIR/kafka/via_upstream_port")"
    fi
    if [[ -f "$RUN_DIR/registry/port" ]]; then
      echo "export WALRELAY_TEST_REGISTRY=http://127.0.0.1:$(cat "$RUN_DIR/registry/port")"
    fi
    if [[ -f "$RUN_DIR/nats/port" ]]; then
      echo "export WALRELAY_TEST_NATS=nats://127.0.0.1:$(cat "$RUN_DIR/nats/port")"
    fi
    if [[ -f "$RUN_DIR/rabbitmq/port" ]]; then
      echo "export WALRELAY_TEST_RABBITMQ=127.0.0.1:$(cat "$RUN_DIR/rabbitmq/port")"
    fi
    if [[ -f "$RUN_DIR/redis/port" ]]; then
      echo "export WALRELAY_TEST_REDIS=127.0.0.1:$(cat "$RUN_DIR/redis/port")"
    fi
    if [[ -f "$RUN_DIR/http/port" ]]; then
      echo "export WALRELAY_TEST_HTTP=127.0.0.1:$(cat "$RUN_DIR/http/port")"
    fi
    if [[ -f "$RUN_DIR/sqs/port" ]]; then
      echo "export WALRELAY_TEST_SQS=http://127.0.0.1:$(cat "$RUN_DIR/sqs/port")"
    fi
    echo "export WALRELAY_TEST_SCRIPTS='$here'"
  } > "$env.tmp.$$"
  mv "$env.tmp.$$" "$env"
}

# What starts or stops a server holds the run dir's lock: tests running side
# by side ask for the same server at once (two `start registry`), and the
# second must find it up and answering, not half started. flock -o keeps the
# lock out of the servers started meanwhile, which outlive this script.
case "${1:-}" in
  start | stop | clean | *-start | *-stop | pg-restart | standby | primary)
    if [[ -z ${WALRELAY_SERVICES_LOCKED:-} ]]; then
      mkdir -p "$(dirname "$RUN_DIR")"
      WALRELAY_SERVICES_LOCKED=1 exec flock -o "$RUN_DIR.lock" "$0" "$@"
    fi ;;
esac

what="${2:-all}"
if [[ ${1:-} == start || ${1:-} == stop ]] && [[ ! $what =~ ^(all|pg|kafka|registry|nats|rabbitmq|redis|http|sqs)$ ]]; then
  echo "usage: $0 $1 [pg|kafka|registry|nats|rabbitmq|redis|http|sqs|all]" >&2; exit 2
fi
case "${1:-}" in
  start)
    mkdir -p "$RUN_DIR"
    [[ $what == all || $what == pg ]] && pg_start
    [[ $what == all || $what == kafka ]] && kafka_start
    [[ $what == registry ]] && registry_start
    [[ $what == nats ]] && nats_start
    [[ $what == rabbitmq ]] && rabbit_start
    [[ $what == redis ]] && redis_start
    [[ $what == http ]] && http_start
    [[ $what == sqs ]] && sqs_start
    write_env
    sed -n 's/^export //p' "$RUN_DIR/env" >&2 ;;
  stop)
    [[ $what == all || $what == registry ]] && registry_stop
    [[ $what == all || $what == nats ]] && nats_stop
    [[ $what == all || $what == rabbitmq ]] && rabbit_stop
    [[ $what == all || $what == redis ]] && redis_stop
    [[ $what == all || $what == http ]] && http_stop
    [[ $what == all || $what == sqs ]] && sqs_stop
    [[ $what == all || $what == kafka ]] && kafka_stop
    [[ $what == all || $what == pg ]] && pg_stop
    true ;;
  kafka-stop) kafka_stop ;;
  kafka-start) kafka_up ;;
  registry-stop) registry_stop keep-port ;;
  registry-start) registry_start keep-port && write_env ;;
  nats-stop) nats_stop keep-port ;;
  nats-start) nats_start keep-port && write_env ;;
  rabbitmq-stop) rabbit_stop keep-port ;;
  rabbitmq-start) rabbit_start keep-port && write_env ;;
  redis-stop) redis_stop keep-port ;;
  redis-start) redis_start keep-port && write_env ;;
  http-stop) http_stop keep-port ;;
  http-start) http_start keep-port && write_env ;;
  sqs-stop) sqs_stop keep-port ;;
  sqs-start) sqs_start keep-port && write_env ;;
  rabbitmqctl) shift; (rabbit_env; "$RABBIT_BIN/rabbitmqctl" -n "$RABBITMQ_NODENAME" "$@") ;;
  pg-restart) as_pg "$(cur_bin)/pg_ctl" -D "$(pg_data_dir "$(cur_major)")" -m "${2:-fast}" -w -t 60 restart \
      -l "$(pg_log "$(cur_major)")" >/dev/null ;;
  standby)
    case "${2:-}" in
      start) standby_start ;;
      promote) standby_promote ;;
      # The primary no longer waits for the standby before logical decoding
      # sends WAL on (17+): an asynchronous failover may lose what was relayed.
      unsync) primary_standby_conf "" ;;
      stop) standby_stop "${3:-fast}" ;;
      *) echo "usage: $0 standby start|promote|unsync|stop [fast|immediate]" >&2; exit 2 ;;
    esac
    write_env ;;
  primary)
    [[ ${2:-} == stop ]] || { echo "usage: $0 primary stop [fast|immediate]" >&2; exit 2; }
    primary_stop "${3:-fast}" ;;
  env) cat "$RUN_DIR/env" ;;
  status)  # exit 0 when both services run
    pg_running && [[ -f "$RUN_DIR/kafka/pid" ]] && alive "$(cat "$RUN_DIR/kafka/pid")" ;;
  clean) "$0" stop; rm -rf "$RUN_DIR" ;;  # the lock file stays: a waiter may hold it open
  *) echo "usage: $0 start|stop [pg|kafka|registry|all] | env | status | kafka-stop | kafka-start | registry-stop | registry-start | nats-stop | nats-start | rabbitmq-stop | rabbitmq-start | redis-stop | redis-start | http-stop | http-start | sqs-stop | sqs-start | rabbitmqctl ARGS | pg-restart [fast|immediate]" \
       "| standby start|promote|stop [fast|immediate] | primary stop [fast|immediate] | clean" >&2; exit 2 ;;
esac
