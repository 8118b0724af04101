#!/usr/bin/env bash
# The alert rules fire on what walrelay really exports. A walrelay with the
# default halt.action (stay) is brought into each state an alert names, its
# /metrics is scraped, and promtool evaluates deploy/prometheus's rules on
# those very series:
#   1. a row it cannot relay (errors.tolerance=none): WalrelayHalted with
#      reason record, WalrelayNotReady after 5 minutes, no WalrelaySlotInvalid.
#      Meanwhile the process stays up (/healthz 200, /readyz 503 naming the
#      row), /status says FAILED with the trace, the slot is not confirmed
#      past the row, and after the fix (errors.tolerance=all written into the
#      file) `walrelay ctl restart` restarts it in place, the same process,
#      which relays every row after it (kcat).
#   2. the slot dropped under it: WalrelaySlotInvalid and WalrelayHalted with
#      reason slot; SIGTERM exits 3.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
need_relay_services
need promtool prometheus
make_tmp
name=alerts_$(basename "$tmp" | tr -c 'a-zA-Z0-9\n' '_' | tr '[:upper:]' '[:lower:]')
table=public.$name
sql() { psql -X -v ON_ERROR_STOP=1 -qAt "$@"; }
pid=''
clean() {
  [[ -z $pid ]] || kill -KILL "$pid" 2>/dev/null || true
  sql -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE '${name}%'" \
    >/dev/null 2>&1 || true
  sql -c "DROP TABLE IF EXISTS $table" -c "DROP PUBLICATION IF EXISTS ${name}_1" \
    -c "DROP PUBLICATION IF EXISTS ${name}_2" >/dev/null 2>&1 || true
}
trap 'clean; rm -rf "$tmp"' EXIT

# aggregatetype may be NULL: such a row has no topic, walrelay cannot relay it.
sql -c "CREATE TABLE $table (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text,
  aggregateid text NOT NULL, type text NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now())" >/dev/null
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

# Writes the configuration of run $1 (slot and publication ${name}_$1) plus
# the lines in $2; no halt.action: the default is what is tested.
configure() {
  cat >"$tmp/walrelay.$1.properties" <<EOF
database.hostname=$PGHOST
database.port=$PGPORT
database.user=postgres
database.dbname=$PGDATABASE
kafka.bootstrap.servers=$WALRELAY_TEST_KAFKA
slot.name=${name}_$1
publication.name=${name}_$1
table.include.list=$table
admin.listen=127.0.0.1:$port
admin.control.token=alerts-control-token
slot.status.interval.ms=1000
$2
EOF
}
get() { python3 - "$port" "$1" <<'PY'
import sys, urllib.request, urllib.error
try:
    r = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}{sys.argv[2]}", timeout=5)
    print(r.status); print(r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code); print(e.read().decode())
PY
}
insert() { sql -c "INSERT INTO $table (aggregatetype, aggregateid, type, payload) VALUES ($1, '$2', 'T', '{}')" >/dev/null; }

# Turns the scrape in $1 into a promtool test: every walrelay_* sample, as
# instance a:8080 of job walrelay, held for 10 minutes; then the alerts
# expected ($2: JSON {alertname: [labels...]}, checked at 6 minutes, after
# every rule's `for`), their annotations rendered from the rules' templates.
promtool_on_scrape() {
  python3 - "$1" "$2" "$REPO/deploy/prometheus/walrelay-alerts.yml" "$tmp/alerts.test.yml" <<'PY'
import json, re, sys, yaml
scrape, expected, rules_file, out = open(sys.argv[1]).read(), json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
series, types = [], dict(re.findall(r"^# TYPE (\S+) (\S+)$", scrape, re.M))
for line in scrape.splitlines():
    # The rules read gauges and counters; histograms' buckets carry +Inf.
    if not line.startswith("walrelay_") or types.get(line.split("{")[0].split(" ")[0]) not in ("gauge", "counter"):
        continue
    m = re.match(r"^([a-z_]+)(?:\{(.*)\})? (\S+)$", line)
    if not m: sys.exit("cannot read the sample: " + line)
    labels = dict(re.findall(r'([a-z_]+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
    labels = {k: v for k, v in labels.items() if v != ""}
    labels.update(job="walrelay", instance="a:8080")
    body = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    series.append({"series": f"{m.group(1)}{{{body}}}", "values": f"{float(m.group(3))!r}x10"})
series.append({"series": 'up{job="walrelay",instance="a:8080"}', "values": "1x10"})
rules = {r["alert"]: r for g in yaml.safe_load(open(rules_file))["groups"] for r in g["rules"]}
def render(template, labels):
    t = re.sub(r"\{\{ with \$labels\.(\w+) \}\}(.*?)\{\{ end \}\}",
               lambda m: m.group(2).replace("{{ . }}", labels[m.group(1)]) if labels.get(m.group(1)) else "", template)
    t = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), t)
    if "{{" in t: sys.exit("cannot render " + template)
    return t
tests = []
for name, rule in rules.items():
    exp = []
    for labels in expected.get(name, []):
        exp.append({"exp_labels": {**rule.get("labels", {}), **labels},
                    "exp_annotations": {k: render(v, labels) for k, v in rule.get("annotations", {}).items()}})
    tests.append({"eval_time": "6m", "alertname": name, "exp_alerts": exp})
yaml.safe_dump({"rule_files": [rules_file], "evaluation_interval": "1m",
                "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": tests}]},
               open(out, "w"), sort_keys=False)
PY
  promtool test rules "$tmp/alerts.test.yml" >"$tmp/promtool.out" 2>&1 \
    || { cat "$tmp/promtool.out" "$tmp/alerts.test.yml" >&2; fail "$3: promtool on walrelay's own series"; }
}

# 1. A row it cannot relay.
configure 1 ""
start "$WALRELAY_DEPLOY_BINARY" --config "$tmp/walrelay.1.properties"
wait_streaming "poison row"
topic=outbox.event.$name
insert "'$name'" before
insert NULL bad
after_bad=$(sql -c "SELECT pg_current_wal_insert_lsn()")  # past the bad row's commit
insert "'$name'" after
wait_halted_up "poison row"
health=$(get /healthz)
[[ ${health%%$'\n'*} == 200 ]] || fail "poison row: /healthz answered $health, not 200 (the process is alive)"
# /healthz needs no token: it must not quote the halt's reason (a row's values).
[[ $health != *"$table"* && $health != *bad* ]] || fail "poison row: /healthz, open to anyone, names the row: $health"
ready=$(get /readyz)
[[ ${ready%%$'\n'*} == 503 && $ready == *"halted"* && $ready == *"$table"* ]] \
  || fail "poison row: /readyz answered $ready, not 503 naming the table"
ok "poison row: halted and up: /healthz 200, /readyz 503 naming $table"
# Nothing at or past the bad row is confirmed, while it stays up.
past=$(sql -c "SELECT confirmed_flush_lsn >= '$after_bad'::pg_lsn FROM pg_replication_slots WHERE slot_name = '${name}_1'")
[[ $past == f ]] || fail "poison row: the slot was confirmed past the row it could not relay"
get /metrics | tail -n +2 >"$tmp/scrape.1"
grep -q "^walrelay_halted{reason=\"record\",slot=\"${name}_1\"} 1" "$tmp/scrape.1" \
  || fail "poison row: no walrelay_halted{reason=record} 1 in $(grep walrelay_halted "$tmp/scrape.1")"
promtool_on_scrape "$tmp/scrape.1" "{\"WalrelayHalted\": [{\"job\": \"walrelay\", \"instance\": \"a:8080\",
  \"slot\": \"${name}_1\", \"reason\": \"record\"}], \"WalrelayNotReady\": [{\"job\": \"walrelay\", \"slot\": \"${name}_1\"}]}" \
  "poison row"
ok "poison row: promtool on the scrape: WalrelayHalted (record) and WalrelayNotReady fire, no other alert"
# /status: Kafka Connect's FAILED, with the trace naming the table and what to do.
status=$(get /status)
python3 - "$status" "$table" <<'PY' || fail "poison row: /status answered $status"
import json, sys
code, body = sys.argv[1].split("\n", 1)
doc = json.loads(body)
assert code == "200", code
assert doc["connector"]["state"] == "FAILED", doc["connector"]
assert sys.argv[2] in doc["connector"]["trace"] and "POST /restart" in doc["connector"]["trace"], doc["connector"]
assert doc["walrelay"]["failure"]["cause"] == "record", doc["walrelay"]
PY
ok "poison row: /status says FAILED, its trace names $table and the restart"
# Still up a scrape later, and still not confirmed: it does not move on.
sleep 2
kill -0 "$pid" 2>/dev/null || fail "poison row: the halted walrelay exited on its own"
# The fix, in the file: its dead-letter copy. walrelay ctl restart reads
# the file again in the same process; the rows after it are relayed.
configure 1 "errors.tolerance=all
errors.deadletterqueue.topic.name=$name.dlq"
"$WALRELAY_DEPLOY_BINARY" ctl --config "$tmp/walrelay.1.properties" restart >"$tmp/ctl.out" 2>&1 \
  || { cat "$tmp/ctl.out" >&2; fail "poison row: walrelay ctl restart failed"; }
for _ in $(seq 60); do
  timeout 20 kcat -b "$WALRELAY_TEST_KAFKA" -C -t "$topic" -o beginning -e -q -f '%k\n' 2>/dev/null | grep -qx after && break
  sleep 0.5
done
keys=$(timeout 20 kcat -b "$WALRELAY_TEST_KAFKA" -C -t "$topic" -o beginning -e -q -f '%k\n' 2>/dev/null | sort -u | tr '\n' ' ')
[[ $keys == "after before " ]] || { cat "$log" >&2; fail "poison row: after the fix $topic holds keys '$keys'"; }
kill -0 "$pid" 2>/dev/null || fail "poison row: the restart was not in place (the process is gone)"
ok "poison row: the fix written, walrelay ctl restart in place, the row after it arrived (kcat)"
stop "poison row: restart"

# 2. The slot dropped under it.
configure 2 ""
start "$WALRELAY_DEPLOY_BINARY" --config "$tmp/walrelay.2.properties"
wait_streaming "dropped slot"
for _ in $(seq 100); do
  sql -c "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = '${name}_2' AND active_pid IS NOT NULL" >/dev/null
  sql -c "SELECT pg_drop_replication_slot('${name}_2')" >/dev/null 2>&1 && break
  sleep 0.05
done
[[ $(sql -c "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '${name}_2'") == 0 ]] \
  || fail "dropped slot: could not drop the slot (premise)"
wait_halted_up "dropped slot"
get /metrics | tail -n +2 >"$tmp/scrape.2"
promtool_on_scrape "$tmp/scrape.2" "{\"WalrelayHalted\": [{\"job\": \"walrelay\", \"instance\": \"a:8080\",
  \"slot\": \"${name}_2\", \"reason\": \"slot\"}], \"WalrelaySlotInvalid\": [{\"job\": \"walrelay\",
  \"instance\": \"a:8080\", \"slot\": \"${name}_2\"}], \"WalrelayNotReady\": [{\"job\": \"walrelay\", \"slot\": \"${name}_2\"}]}" \
  "dropped slot"
ok "dropped slot: promtool on the scrape: WalrelaySlotInvalid and WalrelayHalted (slot) fire"
kill -TERM "$pid"
wait_exit
[[ $rc == 3 ]] || { cat "$log" >&2; fail "dropped slot: SIGTERM ended the halted walrelay with $rc, not 3"; }
[[ $(sql -c "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '${name}_2'") == 0 ]] \
  || fail "dropped slot: walrelay created the slot again"
ok "dropped slot: exit 3 on SIGTERM, no slot created"
