#!/usr/bin/env bash
# docs/operations.md's "Cleaning the outbox table", each recipe run from the
# page's own SQL against a live walrelay with a writer running the whole time,
# one database (and slot) per recipe, the three at once:
#   1. delete in the same transaction: the writer's transaction is the page's
#      block, its placeholders filled in, in the page's order;
#   2. partitions: the page's partitioned table, its publication, and its
#      daily statements (a partition made ahead, the old ones dropped) run
#      while the writer's days go by;
#   3. scheduled delete: the page's batch, repeated while the writer writes.
# The writer records each event's id in a business table in the same
# transaction, since the outbox rows go. Checked: every committed id is in
# Kafka (kcat reads it), and the rows or partitions are gone.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
need_relay_services
make_tmp
doc=$REPO/docs/operations.md
prefix=$(basename "$tmp" | tr -c 'a-zA-Z0-9\n' '_')
recipes=(same partitions scheduled)
sql() { psql -X -v ON_ERROR_STOP=1 -qAt "$@"; }
declare -A writer=() relay=() relaylog=() cleaner=()
clean() {
  for p in "${writer[@]}" "${relay[@]}" "${cleaner[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for r in "${recipes[@]}"; do
    sql -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = 'walrelay_clean_$r'" >/dev/null 2>&1 || true
    sql -c "DROP DATABASE IF EXISTS walrelay_clean_$r WITH (FORCE)" >/dev/null
  done
}
trap 'clean; rm -rf "$tmp"' EXIT
clean

# The section's ```sql blocks, one file each: $tmp/clean.<n>.sql.
n=$(python3 - "$doc" "$tmp/clean" <<'PY'
import re, sys
text, out = open(sys.argv[1]).read(), sys.argv[2]
start = text.index("## Cleaning the outbox table")
end = text.index("\n## ", start + 1)
found = re.findall(r"```sql\n(.*?)```", text[start:end], re.S)
for n, block in enumerate(found):
    open(f"{out}.{n}.sql", "w").write("\n".join(l.strip() for l in block.splitlines()) + "\n")
print(len(found))
PY
)
# (The fifth, the archive table, is run by retention_test.cpp's archive test.)
[[ $n == 5 ]] || fail "the cleaning section has $n SQL blocks, not 5 (same transaction, partitioned table, publication, batch, archive)"
same=$tmp/clean.0.sql partitioned=$tmp/clean.1.sql publication=$tmp/clean.2.sql batch=$tmp/clean.3.sql

# The partitioned table's block: its CREATE TABLE, and the two daily
# statements as templates (the page's dates replaced by the writer's days).
python3 - "$partitioned" "$tmp" <<'PY'
import re, sys
block, out = open(sys.argv[1]).read(), sys.argv[2]
statements = [s.strip() + ";" for s in re.sub(r"--[^\n]*", "", block).split(";") if s.strip()]
table = [s for s in statements if "PARTITION BY RANGE (created_at)" in s]
make = [s for s in statements if " PARTITION OF " in s]
drop = [s for s in statements if s.startswith("DROP TABLE")]
if len(table) != 1 or len(make) != 1 or len(drop) != 1:
    sys.exit(f"the partitioned table's block: {len(table)} tables, {len(make)} partitions made, {len(drop)} dropped")
dates = re.findall(r"'(\d{4}-\d\d-\d\d)'", make[0])
if len(dates) != 2:
    sys.exit("the partition's bounds are not two dates")
# A partition is named and bounded by its day: outbox_YYYYMMDD.
make = make[0].replace(dates[0].replace("-", ""), "{day}").replace(dates[0], "{from}").replace(dates[1], "{to}")
drop = re.sub(r"_\d{8}", "_{day}", drop[0])
open(f"{out}/table.sql", "w").write(table[0] + "\n")
open(f"{out}/make.tmpl", "w").write(make + "\n")
open(f"{out}/drop.tmpl", "w").write(drop + "\n")
PY
[[ $(grep -c '{day}' "$tmp/make.tmpl") == 1 && $(grep -c '{day}' "$tmp/drop.tmpl") == 1 ]] ||
  fail "the daily statements do not name their partition by its day"
grep -q "LIMIT" "$batch" || fail "the scheduled delete does not delete in batches"
ok "the section's four SQL blocks"

# The day N of the writer's calendar (2026-12-01 + N days) as YYYY-MM-DD.
day() { date -u -d "2026-12-01 + $1 days" +%F; }
# The partition statement of the template $1 for day $2.
daily() {
  local d next
  d=$(day "$2"); next=$(day $(($2 + 1)))
  sed -e "s/{day}/${d//-/}/g" -e "s/{from}/$d/g" -e "s/{to}/$next/g" "$tmp/$1.tmpl"
}

outbox_columns="id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload jsonb"
for r in "${recipes[@]}"; do sql -c "CREATE DATABASE walrelay_clean_$r" >/dev/null; done
# 1: the quickstart's table; the application's orders table as the page's
# block names it.
sql -d walrelay_clean_same -c "CREATE TABLE public.outbox ($outbox_columns, created_at timestamptz NOT NULL DEFAULT now())" \
  -c "CREATE TABLE orders (id uuid PRIMARY KEY, n bigint NOT NULL)" >/dev/null
# 2: the page's partitioned table, its first days, and its publication.
sql -d walrelay_clean_partitions -f "$tmp/table.sql" -c "CREATE TABLE orders (id uuid PRIMARY KEY, day int NOT NULL)" >/dev/null
for d in 0 1 2; do daily make $d | sql -d walrelay_clean_partitions >/dev/null; done
sql -d walrelay_clean_partitions -f "$publication" >/dev/null
# 3: rows become older than the page's 7 days 2 s after their insert (a
# default that stands in for a week going by).
sql -d walrelay_clean_scheduled -c "CREATE TABLE public.outbox ($outbox_columns,
  created_at timestamptz NOT NULL DEFAULT now() - interval '7 days' + interval '2 seconds')" \
  -c "CREATE TABLE orders (id uuid PRIMARY KEY)" >/dev/null
ok "the three outbox tables"

for r in "${recipes[@]}"; do
  {
    echo "database.hostname=$PGHOST"
    echo "database.port=$PGPORT"
    echo "database.user=postgres"
    echo "database.dbname=walrelay_clean_$r"
    echo "slot.name=walrelay_clean_$r"
    echo "table.include.list=public.outbox"
    echo "route.topic.replacement=$prefix.\${routedByValue}"
    echo "kafka.bootstrap.servers=$WALRELAY_TEST_KAFKA"
    echo "admin.listen=127.0.0.1:0"
    [[ $r != partitions ]] || echo "publication.autocreate.mode=disabled"  # the page's publication
  } >"$tmp/$r.properties"
  start "$WALRELAY_DEPLOY_BINARY" --config "$tmp/$r.properties"
  wait_streaming "recipe $r"
  relay[$r]=$pid relaylog[$r]=$log
done
pid=''
ok "a walrelay streams for each recipe"

# The writers: one transaction every 5 ms, until $tmp/stop.
# 1: the page's block, its placeholders filled in, each transaction its own id.
python3 - "$same" >"$tmp/same.tmpl" <<'PY'
import sys
out = []
for line in open(sys.argv[1]).read().splitlines():
    line = line.replace("INSERT INTO orders ...;", "INSERT INTO orders (id, n) VALUES ('{id}', {n});")
    line = line.replace("(id, ...)", "(id, aggregatetype, aggregateid, type, payload)")
    line = line.replace("('6f1c...', ...)", "('{id}', 'same', 'k{k}', 'OrderCreated', '{{}}')")
    line = line.replace("'6f1c...'", "'{id}'")
    if "..." in line:
        sys.exit(f"a placeholder the test cannot fill: {line}")
    out.append(line)
print("\n".join(out))
PY
write() {  # $1: the recipe; the transaction's SQL comes from python
  python3 - "$1" "$tmp" <<'PY' | psql -X -v ON_ERROR_STOP=1 -qAt -d "walrelay_clean_$1" >/dev/null
import os, sys, uuid
recipe, tmp = sys.argv[1], sys.argv[2]
template = open(f"{tmp}/same.tmpl").read() if recipe == "same" else None
n = 0
while not os.path.exists(f"{tmp}/stop"):
    n += 1
    i = uuid.uuid4()
    if recipe == "same":
        print(template.format(id=i, n=n, k=n % 8))
    elif recipe == "partitions":  # a day every 150 transactions
        d = n // 150
        print(f"WITH e AS (INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload, created_at) "
              f"VALUES ('{i}', 'partitions', 'k{n % 8}', 'OrderCreated', '{{}}', '2026-12-01'::date + {d}) RETURNING id) "
              f"INSERT INTO orders SELECT id, {d} FROM e;")
    else:
        print(f"WITH e AS (INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload) "
              f"VALUES ('{i}', 'scheduled', 'k{n % 8}', 'OrderCreated', '{{}}') RETURNING id) INSERT INTO orders SELECT id FROM e;")
    print("SELECT pg_sleep(0.005);", flush=True)
PY
}
for r in "${recipes[@]}"; do write "$r" & writer[$r]=$!; done

# 2: the daily job, every 0.2 s of the writer's days: the next three days'
# partitions made, the partitions more than two days old dropped.
(
  dropped=-1
  while [[ ! -e $tmp/stop ]]; do
    today=$(sql -d walrelay_clean_partitions -c "SELECT coalesce(max(day), 0) FROM orders")
    for d in $((today + 1)) $((today + 2)) $((today + 3)); do daily make "$d"; done | sql -d walrelay_clean_partitions >/dev/null
    while ((dropped < today - 3)); do
      dropped=$((dropped + 1))
      daily drop "$dropped" | sql -d walrelay_clean_partitions >/dev/null
    done
    sleep 0.2
  done
) &
cleaner[partitions]=$!
# 3: the page's batch, every 0.5 s, repeated while it deletes rows (psql
# prints its DELETE n).
batches() {
  while [[ $(psql -X -v ON_ERROR_STOP=1 -At -d walrelay_clean_scheduled -f "$batch") != "DELETE 0" ]]; do
    echo deleted >>"$tmp/scheduled.batches"
  done
}
(
  while [[ ! -e $tmp/stop ]]; do
    batches
    sleep 0.5
  done
) 2>"$tmp/scheduled.err" &
cleaner[scheduled]=$!

# The writers, the cleaners and walrelay together for 8 s at least, and until
# the partitions' writer has gone through 6 days (a slow machine writes less).
for second in $(seq 40); do
  sleep 1
  ((second < 8)) && continue
  (($(sql -d walrelay_clean_partitions -c "SELECT coalesce(max(day), 0) FROM orders") >= 6)) && break
done
touch "$tmp/stop"
for r in "${recipes[@]}"; do wait "${writer[$r]}" || fail "the writer of recipe $r failed"; done
for r in partitions scheduled; do wait "${cleaner[$r]}" || fail "the cleaner of recipe $r failed: $(cat "$tmp/scheduled.err")"; done
writer=() cleaner=()
end=$(sql -c "SELECT pg_current_wal_lsn()")
for r in "${recipes[@]}"; do
  for _ in $(seq 300); do
    [[ $(sql -c "SELECT confirmed_flush_lsn >= '$end' FROM pg_replication_slots WHERE slot_name = 'walrelay_clean_$r'") == t ]] && break
    sleep 0.1
  done
  pid=${relay[$r]} log=${relaylog[$r]}
  stop "recipe $r"
  unset "relay[$r]"
done
ok "the writers stopped, every walrelay confirmed past the last write"

# Every committed event is in Kafka (kcat, by the id header), and the table
# is clean.
for r in "${recipes[@]}"; do
  timeout 60 kcat -b "$WALRELAY_TEST_KAFKA" -C -t "$prefix.$r" -o beginning -e -q -f '%h\n' 2>/dev/null |
    sed -n 's/.*\bid=\([0-9a-f-]*\).*/\1/p' | sort -u >"$tmp/$r.sent"
  sql -d "walrelay_clean_$r" -c "SELECT id FROM orders ORDER BY id" >"$tmp/$r.committed"
  committed=$(wc -l <"$tmp/$r.committed")
  missing=$(comm -23 "$tmp/$r.committed" "$tmp/$r.sent" | wc -l)
  echo "recipe $r: committed $committed, in Kafka $(wc -l <"$tmp/$r.sent"), missing $missing"
  ((committed >= 300)) || fail "recipe $r: only $committed events committed"
  ((missing == 0)) || fail "recipe $r: $missing committed events are not in Kafka"
done
ok "every committed event of each recipe reached Kafka"
left=$(sql -d walrelay_clean_same -c "SELECT count(*) FROM public.outbox")
((left == 0)) || fail "recipe 1: $left rows left in the outbox"
ok "recipe 1: the outbox is empty"
days=$(sql -d walrelay_clean_partitions -c "SELECT max(day) FROM orders")
parts=$(sql -d walrelay_clean_partitions -c "SELECT string_agg(c.relname, ' ' ORDER BY c.relname) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'public.outbox'::regclass")
((days >= 5)) || fail "recipe 2: the writer went through $days days only"
[[ $parts != *outbox_20261201* && $parts != *outbox_20261202* ]] || fail "recipe 2: the old partitions are still there: $parts"
ok "recipe 2: $days days written, the old partitions dropped, left: $parts"
sleep 2
batches
left=$(sql -d walrelay_clean_scheduled -c "SELECT count(*) FROM public.outbox")
((left == 0)) || fail "recipe 3: $left rows left after the batches"
ok "recipe 3: $(wc -l <"$tmp/scheduled.batches") batches removed every row older than 7 days"
