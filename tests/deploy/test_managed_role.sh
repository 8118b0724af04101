#!/usr/bin/env bash
# docs/quickstart.md's role on a managed server, run from the page's own SQL:
# an administrator that is not a superuser (CREATEROLE and REPLICATION, the
# owner of the database and of the outbox table, as on RDS, Cloud SQL or
# Azure) creates walrelay's role and hands it the publication; walrelay then
# starts as that role with no CREATE on the database and relays what the
# application writes (kcat reads it). The page's superuser block, run by that
# administrator, must fail: it is why the managed block exists.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
need_relay_services
make_tmp
doc=$REPO/docs/quickstart.md
db=walrelay_managed
prefix=$(basename "$tmp" | tr -c 'a-zA-Z0-9\n' '_')
sql() { psql -X -v ON_ERROR_STOP=1 -qAt "$@"; }
pid=''
clean() {
  [[ -z $pid ]] || kill -KILL "$pid" 2>/dev/null || true
  sql -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = '$db'" >/dev/null 2>&1 || true
  sql -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null
  for r in walrelay app dbadmin; do
    sql -c "DROP OWNED BY $r" >/dev/null 2>&1 || true
    sql -c "DROP ROLE IF EXISTS $r" >/dev/null
  done
}
trap 'clean; rm -rf "$tmp"' EXIT
clean

# The page's role section: the superuser's publication block and the managed
# server's block. The database is called shop there.
python3 - "$doc" "$tmp" "$db" <<'PY'
import re, sys
text, out, db = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3]
section = text[text.index("### The role"):text.index("### The outbox table")]
def block_after(marker):
    return re.findall(r"```sql\n(.*?)```", section[section.index(marker):], re.S)[0]
open(f"{out}/superuser.sql", "w").write(block_after("As a superuser:"))
open(f"{out}/managed.sql", "w").write(block_after("As the administrator,").replace(" shop ", f" {db} ")
                                      .replace("'...'", "'managed-test'"))
PY
grep -q "OWNER TO walrelay" "$tmp/managed.sql" || fail "the managed server's block does not hand the publication over"

# The managed server: an administrator without superuser, owning the
# database; the application's role writes the outbox.
sql >/dev/null <<SQL
CREATE ROLE dbadmin LOGIN CREATEROLE REPLICATION;
CREATE DATABASE $db OWNER dbadmin;
SQL
admin() { PGUSER=dbadmin sql -d $db "$@"; }
admin >/dev/null <<'SQL'
CREATE TABLE public.outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
  aggregateid text NOT NULL, type text NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now());
CREATE ROLE app LOGIN;
GRANT INSERT, SELECT ON public.outbox TO app;
SQL
[[ $(admin -c "SELECT rolsuper FROM pg_roles WHERE rolname = current_user") == f ]] || fail "the administrator is a superuser"
# The superuser's block, run by that administrator for a role it created,
# fails: CREATE on the database is missing (and from 16 on the membership).
admin -c "CREATE ROLE walrelay LOGIN" >/dev/null
if admin -f "$tmp/superuser.sql" >"$tmp/superuser.out" 2>&1; then
  fail "the superuser's block worked for an administrator that is not one: the managed block is not needed"
fi
grep -q "permission denied\|must be able to SET ROLE\|must be member" "$tmp/superuser.out" ||
  fail "the superuser's block failed for another reason: $(cat "$tmp/superuser.out")"
admin -c "DROP PUBLICATION IF EXISTS walrelay" -c "DROP ROLE walrelay" >/dev/null
ok "the superuser's block fails for the administrator: $(head -n 1 "$tmp/superuser.out")"
admin -f "$tmp/managed.sql" >/dev/null
# REPLICATION in the provider's way (its own role or extension does it with
# powers the administrator lacks): here the superuser.
sql -c "ALTER ROLE walrelay REPLICATION" >/dev/null
[[ $(admin -c "SELECT pg_get_userbyid(pubowner) FROM pg_publication WHERE pubname = 'walrelay'") == walrelay ]] ||
  fail "the publication is not walrelay's"
[[ $(admin -c "SELECT has_database_privilege('walrelay', '$db', 'CREATE')") == f ]] ||
  fail "walrelay kept CREATE on the database"
ok "the managed server's block: the publication is walrelay's, walrelay has no CREATE on the database"

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
start env WALRELAY_DATABASE_PASSWORD=managed-test "$WALRELAY_DEPLOY_BINARY" --config "$tmp/walrelay.properties"
wait_streaming "walrelay as the managed server's role"
grep -q "slot=walrelay recorded in the comment of publication" "$log" || fail "walrelay could not record its slot: $(cat "$log")"
for n in 1 2 3; do
  PGUSER=app sql -d $db -c "INSERT INTO public.outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'k$n', 'OrderCreated', '{\"n\": $n}')" >/dev/null
done
got=$(timeout 60 kcat -b "$WALRELAY_TEST_KAFKA" -C -t "$prefix.order" -o beginning -c 3 -q -f '%k\n' 2>/dev/null | sort | tr '\n' ' ')
[[ $got == "k1 k2 k3 " ]] || fail "Kafka has '$got', not the three events"
stop "walrelay as the managed server's role"
ok "walrelay as that role relays the application's events (kcat read k1 k2 k3)"
