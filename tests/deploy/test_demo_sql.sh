#!/usr/bin/env bash
# The demo's SQL runs on PostgreSQL 15: deploy/docker/init.sql, one iteration
# of the Compose writer, and the Kubernetes init script's SQL, each inside a
# transaction that is rolled back (roles and publications too), so the server
# is left as it was. Needs the throwaway server of scripts/services.sh
# (its env, read here when the caller has not), skipped without it; under
# ctest the services fixture runs and a skip is a failure (run.sh --strict).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
load_services
[[ -n ${WALRELAY_TEST_PGHOST:-} ]] || skip "no PostgreSQL (scripts/services.sh start pg)"
need psql postgresql-client-15
need python3 python3
make_tmp

export PGHOST=$WALRELAY_TEST_PGHOST PGPORT=${WALRELAY_TEST_PGPORT:?} PGUSER=${WALRELAY_TEST_PGUSER:-postgres}
export PGDATABASE=${WALRELAY_TEST_PGDATABASE:-postgres}

# The writer's statement, with Compose's $$ unescaped and n=1.
python3 - "$REPO" > "$tmp/writer.sql" <<'PY'
import re, sys, yaml
c = yaml.safe_load(open(sys.argv[1] + "/deploy/docker-compose.yml"))
body = c["services"]["writer"]["command"][0].replace("$$", "$")
sql = re.search(r"BEGIN;\n(.*?)COMMIT;", body, re.S).group(1)
print(sql.replace("$n", "1"))
PY
# The Kubernetes init script's SQL, with its psql variable set.
python3 - "$REPO" > "$tmp/k8s.sql" <<'PY'
import re, sys, yaml
docs = yaml.safe_load_all(open(sys.argv[1] + "/deploy/kubernetes/configmap.yaml"))
script = [d for d in docs if d["metadata"]["name"] == "shop-db-init"][0]["data"]["10-walrelay.sh"]
print(re.search(r"<<'SQL'\n(.*?)\nSQL", script, re.S).group(1))
PY

out=$( {
  echo "BEGIN;"
  cat "$REPO/deploy/docker/init.sql"
  cat "$tmp/writer.sql"
  echo "SELECT 'outbox=' || count(*) FROM outbox WHERE aggregatetype = 'order' AND aggregateid = (SELECT max(id)::text FROM orders);"
  echo "SELECT 'pub=' || string_agg(schemaname || '.' || tablename, ',') FROM pg_publication_tables WHERE pubname = 'walrelay';"
  echo "SELECT 'repl=' || rolreplication FROM pg_roles WHERE rolname = 'walrelay';"
  echo "ROLLBACK;"
} | psql -X -v ON_ERROR_STOP=1 -qAt 2>&1) || fail "init.sql + writer: $out"
grep -qx 'outbox=1' <<<"$out" || fail "writer did not insert one outbox row: $out"
grep -qx 'pub=public.outbox' <<<"$out" || fail "publication: $out"
grep -qx 'repl=true' <<<"$out" || fail "role: $out"
ok "init.sql and the writer's transaction"

out=$( {
  echo "BEGIN;"
  echo "CREATE SCHEMA walrelay_deploy_test; SET LOCAL search_path = walrelay_deploy_test, public;"
  sed 's/public\.outbox/walrelay_deploy_test.outbox/; s/CREATE ROLE walrelay /CREATE ROLE walrelay_deploy_test /; s/CREATE PUBLICATION walrelay /CREATE PUBLICATION walrelay_deploy_test /; s/ALTER PUBLICATION walrelay OWNER TO walrelay/ALTER PUBLICATION walrelay_deploy_test OWNER TO walrelay_deploy_test/' "$tmp/k8s.sql"
  echo "ROLLBACK;"
} | psql -X -v ON_ERROR_STOP=1 -v walrelay_password=test -qAt 2>&1) || fail "kubernetes init SQL: $out"
ok "kubernetes init SQL"
