#!/usr/bin/env bash
# The deploy set-ups started as shipped, against the test PostgreSQL and
# Kafka: the database made with the set-up's own SQL (as the superuser), and
# walrelay configured exactly as the set-up configures it, as the role it
# creates, with only the addresses pointed at the test services. Docker:
# deploy/docker/init.sql, docker-compose.yml's environment and the config
# deploy/docker/entrypoint.sh renders. Kubernetes: the init script and the
# ConfigMap (mounted where the entry point finds it). systemd: the unit's
# ExecStart and EnvironmentFile, with the quickstart's role SQL. The image:
# deploy/docker/Dockerfile built with buildah (tests/deploy/image.sh), its
# entry point run in its root as its user, with the compose file's
# environment: --version names librdkafka 2.8.0, --check passes. Each: the
# first start, events written by an application role and read back with
# kcat, a restart, and a restart after the slot was dropped (halted, it stays
# up until stopped, then exits 3, which the unit does not restart). The set-ups share the names the files use
# (database shop, role and slot walrelay), so they run one after the other and
# each removes what it made.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
need_relay_services
need buildah buildah
need debootstrap debootstrap
make_tmp
mkdir -p "$tmp/bin"
ln -s "$WALRELAY_DEPLOY_BINARY" "$tmp/bin/walrelay"
topic=outbox.event.order
pid=

sql() { psql -X -v ON_ERROR_STOP=1 -qAt "$@"; }

# Drops what a set-up made: the slot, the database, the roles.
clean() {
  [[ -z $pid ]] || { kill -KILL "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; pid=; }
  sql -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = 'walrelay'" >/dev/null
  sql -c "DROP DATABASE IF EXISTS shop WITH (FORCE)" >/dev/null
  sql -c "DROP ROLE IF EXISTS walrelay" -c "DROP ROLE IF EXISTS app" >/dev/null
}
root=
unmount_image() {
  [[ -z $root ]] || { umount "$root/proc" 2>/dev/null || true; "$REPO/tests/deploy/image.sh" unmount; }
}
trap 'clean; unmount_image; rm -rf "$tmp"' EXIT

# Writes one order and its event as the application role; prints its
# aggregate id, unique to this run (the topic outlives the databases).
write_order() {
  local user=$1 tag
  tag=$(basename "$tmp")-$runs
  psql -X -v ON_ERROR_STOP=1 -qAt -U "$user" -d shop -v tag="$tag" <<'SQL'
WITH o AS (INSERT INTO orders (customer_id, total_cents) VALUES (1, 1000) RETURNING id)
INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
SELECT 'order', :'tag' || '-' || o.id, 'OrderCreated', jsonb_build_object('orderId', o.id) FROM o
RETURNING aggregateid;
SQL
}

# Waits until the topic holds a record keyed `key` (kcat, read_committed).
wait_record() {
  for _ in $(seq 60); do
    if timeout 20 kcat -b "$WALRELAY_TEST_KAFKA" -C -t "$topic" -o beginning -e -q -f '%k\n' 2>/dev/null | grep -qx "$2"; then
      return 0
    fi
    sleep 0.5
  done
  cat "$log" >&2
  fail "$1: no record with key $2 in $topic"
}

# The steps every set-up goes through, once its database exists. $1 names
# it, $2 is the application role; the rest is walrelay's command.
walk() {
  local name=$1 app=$2 key
  shift 2
  start "$@"
  wait_streaming "$name: first start"
  key=$(write_order "$app")
  wait_record "$name: first start" "$key"
  grep -q "could not record slot" "$log" && { cat "$log" >&2; fail "$name: the slot marker was not written"; }
  ok "$name: first start as the set-up's role; an event written by $app arrived"
  stop "$name"
  start "$@"
  wait_streaming "$name: restart"
  key=$(write_order "$app")
  wait_record "$name: restart" "$key"
  ok "$name: restart"
  stop "$name"
  sql -c "SELECT pg_drop_replication_slot('walrelay')" >/dev/null
  start "$@"
  # halt.action=stay, the default: halted, it stays up (an alert can fire,
  # a pod is not restarted into the same halt) until stopped, then exits 3.
  wait_halted_up "$name: a start after the slot was dropped"
  kill -TERM "$pid"
  wait_exit
  [[ $rc == 3 ]] || { cat "$log" >&2; fail "$name: the halted walrelay exited $rc on SIGTERM, not 3"; }
  grep -q "reset-slot" "$log" || { cat "$log" >&2; fail "$name: the dropped slot's error does not name --reset-slot"; }
  ok "$name: a start after the slot was dropped halts, stays up until SIGTERM, exits 3 and creates nothing"
  [[ $(sql -c "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'walrelay'") == 0 ]] \
    || fail "$name: a slot was created after the drop"
}

# The orders table the application writes beside its events (the Kubernetes
# and systemd set-ups bring only the outbox).
orders_sql="CREATE TABLE orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, customer_id bigint NOT NULL,
  total_cents bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now());"

# --- Docker: init.sql, the compose file's environment, the rendered config.
clean
sql -c "CREATE DATABASE shop" >/dev/null
sql -d shop -f "$REPO/deploy/docker/init.sql" >/dev/null
python3 - "$REPO/deploy/docker-compose.yml" > "$tmp/compose.env" <<'PY'
import shlex, sys, yaml
env = yaml.safe_load(open(sys.argv[1]))["services"]["walrelay"]["environment"]
for k, v in env.items():
    print(f"{k}={shlex.quote(str(v))}")
PY
grep -q '^WALRELAY_DATABASE_USER=walrelay$' "$tmp/compose.env" || fail "compose: walrelay does not connect as the walrelay role"
# The compose file's environment for walrelay, with the addresses of the
# test services; the rest as the compose file says.
compose_env() {
  set -a
  # shellcheck disable=SC1091
  source "$tmp/compose.env"
  set +a
  export WALRELAY_DATABASE_HOSTNAME=$PGHOST WALRELAY_DATABASE_PORT=$PGPORT
  export WALRELAY_KAFKA_BOOTSTRAP_SERVERS=$WALRELAY_TEST_KAFKA WALRELAY_ADMIN_LISTEN=127.0.0.1:0
}
# Each *_run runs in start()'s background subshell and execs, so that $pid is
# walrelay itself and SIGTERM reaches it.
compose_run() {
  compose_env
  export PATH=$tmp/bin:$PATH CONFIG_FILE=$tmp/none RENDERED_CONFIG_FILE=$tmp/rendered/walrelay.properties
  exec bash "$REPO/deploy/docker/entrypoint.sh"
}
walk compose app compose_run
clean

# --- Kubernetes: the init script and the ConfigMap.
python3 - "$REPO/deploy/kubernetes/configmap.yaml" "$tmp" <<'PY'
import sys, yaml
docs = {d["metadata"]["name"]: d for d in yaml.safe_load_all(open(sys.argv[1]))}
open(sys.argv[2] + "/10-walrelay.sh", "w").write(docs["shop-db-init"]["data"]["10-walrelay.sh"])
open(sys.argv[2] + "/k8s.properties", "w").write(docs["walrelay"]["data"]["walrelay.properties"])
PY
sed -i "s/^database.port=.*/database.port=$PGPORT/; s/^kafka.bootstrap.servers=.*/kafka.bootstrap.servers=$WALRELAY_TEST_KAFKA/; s/^admin.listen=.*/admin.listen=127.0.0.1:0/" "$tmp/k8s.properties"
grep -q '^database.user=walrelay$' "$tmp/k8s.properties" || fail "kubernetes: walrelay does not connect as the walrelay role"
sql -c "CREATE DATABASE shop" >/dev/null
POSTGRES_USER=postgres POSTGRES_DB=shop WALRELAY_ROLE_PASSWORD=k8s-test bash "$tmp/10-walrelay.sh" >/dev/null
sql -d shop -c "$orders_sql" -c "CREATE ROLE app LOGIN" -c "GRANT SELECT, INSERT ON orders, outbox TO app" >/dev/null
k8s_run() {
  # The StatefulSet's container: the image's entry point, the ConfigMap at
  # /etc/walrelay, the password from the Secret.
  PATH=$tmp/bin:$PATH CONFIG_FILE=$tmp/k8s.properties WALRELAY_DATABASE_PASSWORD=k8s-test \
    exec bash "$REPO/deploy/docker/entrypoint.sh"
}
walk kubernetes app k8s_run
clean

# --- systemd: the unit's command line and environment file, the
# quickstart's role and publication.
unit=$REPO/deploy/systemd/walrelay.service
exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
[[ $exec_start == "/usr/local/bin/walrelay --config /etc/walrelay/walrelay.properties" ]] \
  || fail "systemd: ExecStart changed ($exec_start): update this test"
grep -qx 'EnvironmentFile=-/etc/walrelay/walrelay.env' "$unit" || fail "systemd: EnvironmentFile changed: update this test"
python3 - "$REPO/docs/quickstart.md" > "$tmp/role.sql" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
section = text[text.index("### The role"):text.index("### The outbox table")]
blocks = re.findall(r"```sql\n(.*?)```", section, re.S)
# The role, and the variant with a publication made beforehand by a
# superuser (the set-up with the least privilege): the first block and the
# one after "As a superuser".
print(blocks[0].replace("'...'", "'systemd-test'"))
after = section[section.index("As a superuser:"):]
print(re.findall(r"```sql\n(.*?)```", after, re.S)[0])
PY
sql -c "CREATE DATABASE shop" >/dev/null
sql -d shop -c "$orders_sql" -c "CREATE TABLE public.outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload jsonb,
  created_at timestamptz NOT NULL DEFAULT now())" -c "CREATE ROLE app LOGIN" -c "GRANT SELECT, INSERT ON orders, outbox TO app" >/dev/null
sql -d shop -f "$tmp/role.sql" >/dev/null
cat > "$tmp/walrelay.properties" <<PROPS
database.hostname=$PGHOST
database.port=$PGPORT
database.user=walrelay
database.dbname=shop
publication.autocreate.mode=disabled
kafka.bootstrap.servers=$WALRELAY_TEST_KAFKA
admin.listen=127.0.0.1:0
PROPS
echo "WALRELAY_DATABASE_PASSWORD=systemd-test" > "$tmp/walrelay.env"
systemd_run() {
  local cmd=${exec_start//\/usr\/local\/bin\/walrelay/$tmp/bin/walrelay}
  cmd=${cmd//\/etc\/walrelay\/walrelay.properties/$tmp/walrelay.properties}
  set -a
  # shellcheck disable=SC1091
  source "$tmp/walrelay.env"
  set +a
  # shellcheck disable=SC2086  # the unit's command line, split as systemd does
  exec $cmd
}
walk systemd app systemd_run
grep -qE '^RestartPreventExitStatus=.*\b3\b' "$unit" || fail "systemd: exit 3 (the dropped slot) would be restarted"
ok "systemd: the unit does not restart exit 3"

# --- The image, built from the Dockerfile: its binary and entry point in its
# root file system, as its user, configured as the compose file configures it.
root=$("$REPO/tests/deploy/image.sh" build)
[[ -x $root/usr/bin/walrelay ]] || fail "image: no /usr/bin/walrelay in $root"
user=$(sed -n 's/^USER //p' "$REPO/deploy/docker/Dockerfile")
entrypoint=$(sed -n 's/^ENTRYPOINT \["\(.*\)"\]$/\1/p' "$REPO/deploy/docker/Dockerfile")
[[ -n $user && -n $entrypoint ]] || fail "image: no USER or ENTRYPOINT in the Dockerfile"
mount -t proc proc "$root/proc"
version=$(chroot --userspec="$user" "$root" /usr/bin/walrelay --version)
[[ $version == *"librdkafka 2.8.0"* ]] || fail "image: $version (expected librdkafka 2.8.0)"
ok "image: $version"
image_run() {
  compose_env
  exec chroot --userspec="$user" "$root" "$entrypoint" "$@"
}
clean
sql -c "CREATE DATABASE shop" >/dev/null
sql -d shop -f "$REPO/deploy/docker/init.sql" >/dev/null
out=$(image_run --check 2>&1) || { echo "$out" >&2; fail "image: --check against the test services failed"; }
ok "image: --check against the test services"
walk image app image_run
