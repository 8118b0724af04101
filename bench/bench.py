#!/usr/bin/env python3
"""End-to-end benchmark: walrelay against pg_recvlogical, Debezium's embedded
engine and a polling relay, on one PostgreSQL, one Kafka and one workload.

Started by bench/run.sh, which starts the services, builds what is needed and
passes their coordinates. Each contender gets a fresh outbox, its own slot and
publication (created before the rows are inserted, so the WAL is there before
the contender starts) and its own topics. Results go to --out as JSON and CSV.
"""
import argparse
import csv
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

import psycopg

import provenance
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

TYPES = ["Order", "Customer", "Invoice", "Shipment"]
PARTITIONS = 3
SAMPLE_S = 0.02          # monitor period
CLK_TCK = os.sysconf("SC_CLK_TCK")
# The full run's services (and Kafka's data) outlive it: slot names repeat
# from run to run, and walrelay's default transactional id comes from them,
# so an exactly-once walrelay would find an earlier run's committed position
# (and warn that its new slot stands past it). Each run has ids of its own.
RUN_ID = time.strftime("%Y%m%d%H%M%S", time.gmtime())

SCHEMA_SQL = """
DROP TABLE IF EXISTS outbox;
CREATE TABLE outbox (
  id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  seq bigserial UNIQUE,
  aggregatetype text NOT NULL,
  aggregateid text NOT NULL,
  type text NOT NULL,
  payload jsonb NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
) WITH (autovacuum_enabled = false);

-- n rows in transactions of tx rows; payload text ~200 bytes; 4 aggregate
-- types, 10,000 aggregates (an aggregate always has the same type).
CREATE OR REPLACE PROCEDURE bench_fill(n int, tx int) LANGUAGE plpgsql AS $$
DECLARE i int := 0;
BEGIN
  WHILE i < n LOOP
    INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
    SELECT (ARRAY['Order','Customer','Invoice','Shipment'])[g % 4 + 1], 'agg-' || (g % 10000), 'Created',
           jsonb_build_object('eventNo', g, 'aggregate', 'agg-' || (g % 10000), 'amount', g % 1000,
                              'currency', 'EUR', 'pad', repeat('x', 120))
    FROM generate_series(i, least(i + tx, n) - 1) g;
    COMMIT;
    i := i + tx;
  END LOOP;
END $$;

-- One-row transactions at `rate` per second for `seconds`; the payload
-- carries the insert time (clock_timestamp, microseconds since the epoch),
-- taken just before the row's COMMIT.
CREATE OR REPLACE PROCEDURE bench_paced(rate int, seconds int) LANGUAGE plpgsql AS $$
DECLARE
  t0 timestamptz := clock_timestamp();
  i int := 0;
  total int := rate * seconds;
  ahead float8;
BEGIN
  WHILE i < total LOOP
    INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
    VALUES ((ARRAY['Order','Customer','Invoice','Shipment'])[i % 4 + 1], 'agg-' || (i % 10000), 'Created',
            jsonb_build_object('ts', (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, 'eventNo', i,
                               'pad', repeat('x', 120)));
    COMMIT;
    i := i + 1;
    ahead := extract(epoch FROM (t0 + make_interval(secs => i::float8 / rate) - clock_timestamp()));
    IF ahead > 0.001 THEN PERFORM pg_sleep(ahead); END IF;
  END LOOP;
END $$;
"""


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def lsn_int(s):
    hi, lo = s.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def proc_cpu_s(pid):
    """utime+stime of a process (all its threads), in seconds; None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def proc_sched_s(pid):
    """Time on CPU of a process's live threads, in seconds, from the scheduler's
    nanosecond counters (/proc/PID/task/*/schedstat); None when gone. Precise
    where utime+stime (whole clock ticks, 10 ms) is not: an idle relay spends
    a few milliseconds a second."""
    try:
        total = 0
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except (OSError, IndexError, ValueError):
                pass  # a thread that ended between the listing and the read
        return total / 1e9
    except OSError:
        return None


def proc_wakeups(pid):
    """Voluntary context switches of a process's live threads (each a sleep,
    then a wake-up: in epoll_wait, poll, a futex); None when gone. The CPU a
    relay spends per event rises with them when it is faster than the
    walsender and each wake-up finds a few events only."""
    try:
        total = 0
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/status") as f:
                    for line in f:
                        if line.startswith("voluntary_ctxt_switches:"):
                            total += int(line.split()[1])
            except (OSError, IndexError, ValueError):
                pass  # a thread that ended between the listing and the read
        return total
    except OSError:
        return None


def proc_hwm_kb(pid):
    """Peak resident set (VmHWM) in KiB; None when gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def machine_busy_s():
    """Busy CPU seconds of the whole machine so far (all cores, from /proc/stat; steal excluded)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4] - v[7]) / CLK_TCK  # minus idle, iowait, steal


class Env:
    def __init__(self, args):
        self.args = args
        self.pg_dsn = f"host=127.0.0.1 port={args.pgport} user=postgres dbname=postgres"
        self.kafka = args.kafka
        self.pg = psycopg.connect(self.pg_dsn, autocommit=True)
        self.mon = psycopg.connect(self.pg_dsn, autocommit=True, application_name="bench-monitor")
        self.admin = AdminClient({"bootstrap.servers": self.kafka})
        self.warm_up()

    def warm_up(self):
        """A first idempotent producer waits for the broker to load its coordinators
        (about a second on a fresh broker): pay that here, not in a contender's start-up."""
        from confluent_kafka import Producer
        p = Producer({"bootstrap.servers": self.kafka, "enable.idempotence": True, "acks": "all"})
        p.produce("bench_warmup", b"x")
        p.flush(60)

    def q(self, sql, params=None, conn=None):
        cur = (conn or self.pg).execute(sql, params)
        return cur.fetchall() if cur.description else None

    def one(self, sql, params=None, conn=None):
        rows = self.q(sql, params, conn)
        return rows[0][0] if rows else None

    # --- database -----------------------------------------------------------
    def reset_outbox(self):
        for (slot,) in self.q("SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE 'bench%'"):
            self.drop_slot(slot)
        for (pub,) in self.q("SELECT pubname FROM pg_publication WHERE pubname LIKE 'bench%'"):
            self.q(f'DROP PUBLICATION "{pub}"')
        self.q(SCHEMA_SQL)
        self.q("CHECKPOINT")

    def drop_slot(self, slot):
        for _ in range(100):
            pid = self.one("SELECT active_pid FROM pg_replication_slots WHERE slot_name=%s", (slot,))
            if pid is None:
                break
            self.q("SELECT pg_terminate_backend(%s)", (pid,))
            time.sleep(0.1)
        self.q("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name=%s", (slot,))

    def create_slot(self, name):
        """A pgoutput slot; returns its start LSN."""
        return self.one("SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))

    def create_slot_and_publication(self, name):
        self.q(f'CREATE PUBLICATION "{name}" FOR TABLE public.outbox WITH (publish = \'insert\')')
        return self.create_slot(name)

    def fill(self, n, tx):
        t0 = time.monotonic()
        self.q("CALL bench_fill(%s, %s)", (n, tx))
        end_lsn = self.one("SELECT pg_current_wal_insert_lsn()::text")
        self.q("ANALYZE outbox")
        log(f"inserted {n} rows in {tx}-row transactions in {time.monotonic() - t0:.1f} s; end LSN {end_lsn}")
        return end_lsn

    def pg_load_begin(self):
        self.q("SELECT pg_stat_statements_reset()")
        self.q("SELECT pg_stat_clear_snapshot()")
        return self.table_stats()

    def table_stats(self):
        self.q("SELECT pg_stat_clear_snapshot()")
        r = self.q("SELECT coalesce(seq_scan,0), coalesce(idx_scan,0), n_tup_ins, n_tup_upd, n_tup_del "
                   "FROM pg_stat_user_tables WHERE relname='outbox'")
        return dict(zip(["seq_scan", "idx_scan", "n_tup_ins", "n_tup_upd", "n_tup_del"], r[0])) if r else {}

    def pg_load_end(self, before):
        time.sleep(0.6)  # the stats collector's flush interval (PG15 flushes at most every 1 s when busy)
        after = self.table_stats()
        stmts = self.q(
            "SELECT calls, round(total_exec_time::numeric, 1)::float8, rows, left(regexp_replace(query, '\\s+', ' ', 'g'), 160) "
            "FROM pg_stat_statements WHERE query ILIKE '%outbox%' "
            "AND query NOT ILIKE '%pg_stat%' AND query NOT ILIKE '%bench_fill%' AND query NOT ILIKE '%ANALYZE%' "
            "ORDER BY total_exec_time DESC LIMIT 10")
        all_calls = self.one(
            "SELECT coalesce(sum(calls),0)::bigint FROM pg_stat_statements s JOIN pg_roles r ON r.oid=s.userid "
            "WHERE query NOT ILIKE '%pg_stat%' AND query NOT ILIKE '%pg_replication_slots%' "
            "AND query NOT ILIKE '%pg_current_wal%'")
        return {
            "outbox_statements": [{"calls": c, "total_exec_ms": t, "rows": r, "query": q} for c, t, r, q in stmts],
            "outbox_statement_calls": sum(s[0] for s in stmts),
            "outbox_statement_exec_ms": round(sum(s[1] for s in stmts), 1),
            "other_statement_calls": int(all_calls),
            "outbox_table": {k: after.get(k, 0) - before.get(k, 0) for k in after},
        }

    # --- kafka --------------------------------------------------------------
    def topics(self, prefix):
        return [f"{prefix}.{t}" for t in TYPES]

    def create_topics(self, prefix, log_append_time=False):
        cfg = {"message.timestamp.type": "LogAppendTime"} if log_append_time else {}
        fs = self.admin.create_topics([NewTopic(t, PARTITIONS, 1, config=cfg) for t in self.topics(prefix)])
        for t, f in fs.items():
            try:
                f.result()
            except Exception as e:  # noqa: BLE001 - an existing topic is fine
                if "TOPIC_ALREADY_EXISTS" not in str(e):
                    raise
        # wait until the metadata shows the partitions with leaders
        for _ in range(100):
            md = self.admin.list_topics(timeout=5)
            if all(t in md.topics and len(md.topics[t].partitions) == PARTITIONS for t in self.topics(prefix)):
                return
            time.sleep(0.1)

    def delete_topics(self, prefix):
        fs = self.admin.delete_topics(self.topics(prefix))
        for f in fs.values():
            try:
                f.result()
            except Exception:  # noqa: BLE001
                pass

    def topic_count(self, prefix):
        req = {TopicPartition(t, p): OffsetSpec.latest() for t in self.topics(prefix) for p in range(PARTITIONS)}
        fs = self.admin.list_offsets(req, request_timeout=5)
        return sum(f.result().offset for f in fs.values())


class Run:
    """One contender process watched until every event is in Kafka (or the slot is drained)."""

    def __init__(self, env, name, cmd, n, prefix=None, slot=None, end_lsn=None, pg_app=None, cwd=None,
                 extra_env=None, timeout_s=1800, stderr_path=None):
        self.env, self.name, self.cmd, self.n = env, name, cmd, n
        self.prefix, self.slot, self.end_lsn, self.pg_app = prefix, slot, end_lsn, pg_app
        self.cwd, self.extra_env, self.timeout_s, self.stderr_path = cwd, extra_env, timeout_s, stderr_path

    def go(self):
        env = self.env
        stderr = open(self.stderr_path, "w") if self.stderr_path else subprocess.DEVNULL
        penv = dict(os.environ, **(self.extra_env or {}))
        broker0, busy0 = proc_cpu_s(env.args.kafka_pid) if env.args.kafka_pid else None, machine_busy_s()
        t_launch = time.monotonic()
        proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=stderr, cwd=self.cwd, env=penv)
        t_first = t_last = t_confirm = None
        cpu = hwm = wakeups = None
        pg_pid = None
        pg_cpu0 = pg_cpu = None
        count = 0
        end = lsn_int(self.end_lsn) if self.end_lsn else None
        exited = None
        while True:
            now = time.monotonic()
            if now - t_launch > self.timeout_s:
                log(f"{self.name}: timeout after {self.timeout_s} s with {count}/{self.n} events")
                break
            if self.prefix and t_first is None and proc.poll() is None:
                # Until the first record: only the watermarks, every 2 ms, so that
                # start-up is measured to a few ms (a full sample takes ~10 ms).
                # CPU and VmHWM are cumulative: the later samples include this time.
                try:
                    if env.topic_count(self.prefix) > 0:
                        t_first = time.monotonic()
                except Exception:  # noqa: BLE001 - metadata not there yet
                    pass
                if t_first is None:
                    time.sleep(0.002)
                    continue
            c = proc_cpu_s(proc.pid)
            h = proc_hwm_kb(proc.pid)
            w = proc_wakeups(proc.pid)
            if c is not None and proc.poll() is None:
                cpu, hwm = c, h
                if w is not None:
                    wakeups = w
            # the walsender (slot) or the relay's backend (application_name)
            if pg_pid is None:
                if self.slot:
                    pg_pid = env.one("SELECT active_pid FROM pg_replication_slots WHERE slot_name=%s", (self.slot,),
                                     conn=env.mon)
                elif self.pg_app:
                    pg_pid = env.one("SELECT pid FROM pg_stat_activity WHERE application_name=%s LIMIT 1",
                                     (self.pg_app,), conn=env.mon)
                if pg_pid is not None:
                    pg_cpu0 = proc_cpu_s(pg_pid)
            if pg_pid is not None:
                v = proc_cpu_s(pg_pid)
                if v is not None:
                    pg_cpu = v
            if self.prefix:
                try:
                    count = env.topic_count(self.prefix)
                except Exception:  # noqa: BLE001 - metadata not there yet
                    count = 0
                if count > 0 and t_first is None:
                    t_first = time.monotonic()
                if count >= self.n and t_last is None:
                    t_last = time.monotonic()
            if self.slot and end is not None and t_confirm is None:
                lsn = env.one("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name=%s",
                              (self.slot,), conn=env.mon)
                if lsn and lsn_int(lsn) >= end:
                    t_confirm = time.monotonic()
            exited = proc.poll()
            if exited is not None:
                if self.prefix is None and t_last is None:
                    t_last = time.monotonic()  # pg_recvlogical: exit at --endpos
                break
            done_kafka = self.prefix is None or t_last is not None
            done_slot = not self.slot or t_confirm is not None or (t_last is not None and now - t_last > 10)
            if done_kafka and done_slot:
                break
            time.sleep(SAMPLE_S)
        broker1, busy1, t_end = (proc_cpu_s(env.args.kafka_pid) if env.args.kafka_pid else None,
                                 machine_busy_s(), time.monotonic())
        if exited is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.prefix:
            count = env.topic_count(self.prefix)
        r = {
            "contender": self.name,
            "events": self.n,
            "events_in_kafka": count if self.prefix else None,
            "exit_code": exited,
            "startup_s": round(t_first - t_launch, 3) if t_first else None,
            "first_to_last_s": round(t_last - t_first, 3) if (t_first and t_last) else None,
            "launch_to_last_s": round(t_last - t_launch, 3) if t_last else None,
            "launch_to_slot_confirmed_s": round(t_confirm - t_launch, 3) if t_confirm else None,
            "cpu_s": round(cpu, 2) if cpu is not None else None,
            "wakeups": wakeups,
            "peak_rss_mib": round(hwm / 1024, 1) if hwm else None,
            "pg_backend_cpu_s": round(pg_cpu - pg_cpu0, 2) if (pg_cpu is not None and pg_cpu0 is not None) else None,
        }
        if broker0 is not None and broker1 is not None:
            r["broker_cpu_us_per_event"] = round((broker1 - broker0) * 1e6 / self.n, 2)
        r["machine_busy_cores"] = round((busy1 - busy0) / (t_end - t_launch), 2)  # of os.cpu_count()
        # Everything else on the machine (other users' builds and tests, the harness itself):
        # busy time not spent in the contender, its walsender/backend or the broker.
        ours = (cpu or 0) + ((pg_cpu - pg_cpu0) if (pg_cpu is not None and pg_cpu0 is not None) else 0) + \
            ((broker1 - broker0) if (broker0 is not None and broker1 is not None) else 0)
        r["other_busy_cores"] = round(max(0.0, (busy1 - busy0) - ours) / (t_end - t_launch), 2)
        span = r["first_to_last_s"] if self.prefix else r["launch_to_last_s"]
        r["events_per_s"] = round(self.n / span) if span else None
        r["total_events_per_s"] = round(self.n / r["launch_to_last_s"]) if r["launch_to_last_s"] else None
        if r["cpu_s"] is not None:
            r["cpu_us_per_event"] = round(r["cpu_s"] * 1e6 / self.n, 2)
        if wakeups is not None:
            r["events_per_wakeup"] = round(self.n / max(1, wakeups), 1)
        if r["pg_backend_cpu_s"] is not None:
            r["pg_backend_cpu_us_per_event"] = round(r["pg_backend_cpu_s"] * 1e6 / self.n, 2)
        return r


# --- contenders ---------------------------------------------------------------

def walrelay_props(env, name, prefix, extra=None):
    """A walrelay configuration file: defaults plus the bench's slot, topics and services."""
    props = {
        "database.hostname": "127.0.0.1",
        "database.port": str(env.args.pgport),
        "database.user": "postgres",
        "database.dbname": "postgres",
        "slot.name": name,
        "publication.name": name,
        "kafka.bootstrap.servers": env.kafka,
        "route.topic.replacement": prefix + ".${routedByValue}",
        "admin.listen": "127.0.0.1:0",
    }
    props.update(extra or {})
    props.update(kv.split("=", 1) for kv in env.args.walrelay_set)
    if props.get("exactly.once.support") == "required":
        props.setdefault("kafka.transactional.id", f"walrelay-bench-{RUN_ID}-{name}")
    props = {k: v for k, v in props.items() if v is not None}  # None: a default key left out
    path = os.path.join(env.args.work, f"{name}.properties")
    with open(path, "w") as f:
        f.write("".join(f"{k}={v}\n" for k, v in props.items()))
    return path


def prepare_round(env, n, tx, names, topic_prefixes):
    """A fresh outbox, one publication, a slot per WAL contender (created before
    the rows, so each one decodes the same WAL), the contenders' topics, then the
    rows. Returns the end LSN of the inserts."""
    env.reset_outbox()
    env.q('CREATE PUBLICATION bench_pub FOR TABLE public.outbox WITH (publish = \'insert\')')
    for name in names:
        env.create_slot(name)
    for prefix in topic_prefixes:
        env.create_topics(prefix)
    return env.fill(n, tx)


# The bench payload's schema in each registry format (bench_fill's JSON:
# eventNo, aggregate, amount, currency, pad).
FORMAT_SCHEMAS = {
    "avro": ("io.confluent.connect.avro.AvroConverter", "AVRO", json.dumps({
        "type": "record", "name": "BenchEvent", "namespace": "walrelay.bench", "fields": [
            {"name": "eventNo", "type": "long"}, {"name": "aggregate", "type": "string"},
            {"name": "amount", "type": "int"}, {"name": "currency", "type": "string"},
            {"name": "pad", "type": "string"}]})),
    "json-schema": ("io.confluent.connect.json.JsonSchemaConverter", "JSON", json.dumps({
        "type": "object", "required": ["eventNo", "aggregate", "amount", "currency"],
        "properties": {"eventNo": {"type": "integer"}, "aggregate": {"type": "string"},
                       "amount": {"type": "integer", "minimum": 0}, "currency": {"type": "string"},
                       "pad": {"type": "string"}}})),
    "protobuf": ("io.confluent.connect.protobuf.ProtobufConverter", "PROTOBUF",
                 'syntax = "proto3";\npackage walrelay.bench;\nmessage BenchEvent { int64 eventNo = 1; '
                 'string aggregate = 2; int32 amount = 3; string currency = 4; string pad = 5; }\n'),
}


def register_schemas(registry, prefix, fmt):
    """Registers the payload's schema under every topic's <topic>-value subject."""
    import urllib.request
    _, schema_type, schema = FORMAT_SCHEMAS[fmt]
    for topic in [f"{prefix}.{t}" for t in TYPES]:
        body = {"schema": schema}
        if schema_type != "AVRO":
            body["schemaType"] = schema_type
        req = urllib.request.Request(f"{registry}/subjects/{topic}-value/versions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            resp.read()


def recvlogical_cmd(env, slot, publication, options):
    """pg_recvlogical streaming a slot to /dev/null with pgoutput `options`
    (e.g. proto_version=1); with nothing added, as an operator runs it (its
    default status and fsync intervals, until stopped)."""
    return [env.args.pg_recvlogical, "-h", "127.0.0.1", "-p", str(env.args.pgport), "-U", "postgres",
            "-d", "postgres", "--slot", slot, "--start", "-f", "/dev/null",
            "-o", f"publication_names={publication}"] + [x for o in options for x in ("-o", o)]


def run_pg_recvlogical(env, n, slot, end_lsn, options):
    before = env.pg_load_begin()
    # to the end LSN and out; status every second, no fsync: a reference client on the same WAL
    cmd = recvlogical_cmd(env, slot, "bench_pub", options) + ["-E", end_lsn, "-s", "1", "-F", "0", "--no-loop"]
    r = Run(env, "pg_recvlogical", cmd, n, slot=slot, end_lsn=None,
            stderr_path=os.path.join(env.args.work, f"{slot}.log")).go()
    r["options"] = " ".join(options)
    r["pg_load"] = env.pg_load_end(before)
    env.drop_slot(slot)
    return r


def broker_tool(env, broker, args):
    """tests/integration/{nats,rabbitmq,redis}/read.py with the tests' venv (nats-py, pika, redis-py)."""
    py = subprocess.run([os.path.join(env.args.bench_dir, "..", "scripts", "py-venv.sh")], check=True,
                        capture_output=True, text=True).stdout.strip()
    script = os.path.join(env.args.bench_dir, "..", "tests", "integration", broker, "read.py")
    url = {"nats": env.args.nats, "rabbitmq": env.args.rabbitmq, "redis": env.args.redis}[broker]
    subprocess.run([py, script, "--url", url] + args, check=True, capture_output=True, text=True)


def test_tool(env, broker, args):
    """tests/integration/{http,sqs}/read.py (the receiver's store; boto3) with the tests' venv."""
    py = subprocess.run([os.path.join(env.args.bench_dir, "..", "scripts", "py-venv.sh")], check=True,
                        capture_output=True, text=True).stdout.strip()
    script = os.path.join(env.args.bench_dir, "..", "tests", "integration", broker, "read.py")
    store = os.path.join(os.environ["WALRELAY_RUN_DIR"], broker, "store")
    where = ["--endpoint", env.args.sqs] if broker == "sqs" else []
    return subprocess.run([py, script] + args[:1] + where + ["--store", store] + args[1:], check=True,
                          capture_output=True, text=True, env=dict(os.environ, **AWS_TEST_KEYS)).stdout


# ElasticMQ takes any credentials; walrelay's SQS sink reads them as the AWS CLI does.
AWS_TEST_KEYS = {"AWS_ACCESS_KEY_ID": "walrelay-bench", "AWS_SECRET_ACCESS_KEY": "walrelay-bench-secret"}


def run_walrelay_sink(env, n, slot, end_lsn, sink):
    """walrelay relaying one WAL to another sink than Kafka: done when the slot
    is confirmed past the end (walrelay confirms only what the broker acknowledged)."""
    extra_env = None
    if sink == "http":
        # Batches of up to 200 (Debezium Server's default size) of one route,
        # to the tests' receiver (Python's standard library: each request
        # appended to a file and flushed before its 200).
        extra = {"sink.type": "http", "sink.http.url": f"http://{env.args.http}/${{topic}}",
                 "sink.http.batch.enabled": "true"}
        broker_pid = open(os.path.join(os.environ["WALRELAY_RUN_DIR"], "http", "pid")).read().strip()
    elif sink == "sqs":
        # FIFO queues, one per route (ElasticMQ, in memory: bench/run.sh).
        test_tool(env, "sqs", ["create", "--queue"] + [f"{slot}_{t}.fifo" for t in TYPES])
        extra = {"sink.type": "sqs", "sink.sqs.queue.url": f"{env.args.sqs}/000000000000/${{topic}}.fifo",
                 "sink.sqs.region": "us-east-1"}
        extra_env = AWS_TEST_KEYS
        broker_pid = open(os.path.join(os.environ["WALRELAY_RUN_DIR"], "sqs", "pid")).read().strip()
    elif sink == "nats-jetstream":
        broker_tool(env, "nats", ["stream-add", "--name", slot, "--subjects", slot + ".>"])
        extra = {"sink.type": "nats-jetstream", "sink.nats-jetstream.url": env.args.nats}
        broker_pid = open(os.path.join(os.environ["WALRELAY_RUN_DIR"], "nats", "pid")).read().strip()
    elif sink == "redis":
        extra = {"sink.type": "redis", "sink.redis.address": env.args.redis}
        broker_pid = open(os.path.join(os.environ["WALRELAY_RUN_DIR"], "redis", "pid")).read().strip()
    else:
        broker_tool(env, "rabbitmq", ["declare", "--exchange", slot, "--queue", slot, "--binding", slot + ".#"])
        host, port = env.args.rabbitmq.rsplit(":", 1)
        extra = {"sink.type": "rabbitmq", "sink.rabbitmq.connection.host": host, "sink.rabbitmq.connection.port": port,
                 "sink.rabbitmq.exchange": slot}
        broker_pid = open(os.path.join(os.environ["WALRELAY_RUN_DIR"], "rabbitmq", "pid")).read().strip()
    # Status updates every 100 ms: the end is seen within 0.1 s of the last acknowledgement.
    props = walrelay_props(env, slot, slot, dict({"publication.name": "bench_pub", "kafka.bootstrap.servers": None,
                                                  "status.update.interval.ms": "100"}, **extra))
    b0 = proc_cpu_s(int(broker_pid))
    r = Run(env, "walrelay", [env.args.walrelay, "--config", props], n, slot=slot, end_lsn=end_lsn,
            extra_env=extra_env, stderr_path=os.path.join(env.args.work, f"{slot}.log")).go()
    b1 = proc_cpu_s(int(broker_pid))
    span = r.get("launch_to_slot_confirmed_s")
    r["events_per_s"] = round(n / span) if span else None
    if b0 is not None and b1 is not None:
        r["broker_cpu_us_per_event"] = round((b1 - b0) * 1e6 / n, 2)
    env.drop_slot(slot)
    if sink in ("http", "sqs"):
        test_tool(env, sink, ["delete", "--prefix", slot])
    elif sink == "nats-jetstream":
        broker_tool(env, "nats", ["stream-delete", "--name", slot])
    elif sink == "redis":
        broker_tool(env, "redis", ["delete", "--prefix", slot])
    else:
        broker_tool(env, "rabbitmq", ["delete", "--exchange", slot, "--queue", slot])
    return r


def curl_post_bench(env, n, per_request, parallel):
    """events/s of curl -Z POSTing n events in JSON arrays of per_request
    ~220-byte values to the tests' receiver, `parallel` at once."""
    work = env.args.work
    body = os.path.join(work, "curl_body.json")
    with open(body, "w") as f:
        f.write("[" + ",".join(json.dumps({"eventNo": i, "aggregate": f"agg-{i}", "amount": i, "currency": "EUR",
                                           "pad": "x" * 120}) for i in range(per_request)) + "]")
    conf = os.path.join(work, "curl_requests.conf")
    with open(conf, "w") as f:
        for _ in range(n // per_request):
            # No "Expect: 100-continue" (curl 7.88 asks it for bodies over 1 KiB, and
            # waits a second for a receiver that does not answer it).
            f.write(f'url = "http://{env.args.http}/bench_curl_ref"\ndata-binary = "@{body}"\n'
                    'header = "Content-Type: application/json"\nheader = "Expect:"\noutput = "/dev/null"\n')
    t0 = time.monotonic()
    subprocess.run(["curl", "-s", "-Z", "--parallel-max", str(parallel), "-K", conf], check=True, timeout=900,
                   capture_output=True)
    took = time.monotonic() - t0
    test_tool(env, "http", ["delete", "--prefix", "bench_curl_ref"])
    return round(n // per_request * per_request / took)


def boto3_sqs_bench(env, n, threads):
    """messages/s of boto3's SendMessageBatch (10 a call) to one FIFO queue, `threads` at once."""
    py = subprocess.run([os.path.join(env.args.bench_dir, "..", "scripts", "py-venv.sh")], check=True,
                        capture_output=True, text=True).stdout.strip()
    code = """
import json, sys, threading, time, boto3
endpoint, n, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sqs = boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1")
url = sqs.create_queue(QueueName="bench_boto3_ref.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
body = json.dumps({"eventNo": 0, "aggregate": "agg-0", "amount": 0, "currency": "EUR", "pad": "x" * 120})
calls = n // 10
def work(t):
    c = boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1")
    for k in range(t, calls, threads):
        c.send_message_batch(QueueUrl=url, Entries=[
            {"Id": str(i), "MessageBody": body, "MessageGroupId": f"g{k * 10 + i}",
             "MessageDeduplicationId": f"d{k * 10 + i}"} for i in range(10)])
t0 = time.monotonic()
ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
[t.start() for t in ts]
[t.join() for t in ts]
took = time.monotonic() - t0
sqs.delete_queue(QueueUrl=url)
print(round(calls * 10 / took))
"""
    out = subprocess.run([py, "-c", code, env.args.sqs, str(n), str(threads)], check=True, capture_output=True,
                         text=True, timeout=900, env=dict(os.environ, **AWS_TEST_KEYS)).stdout
    return int(out.strip().splitlines()[-1])


def run_walrelay(env, n, slot, end_lsn, extra=None, binary=None):
    props = walrelay_props(env, slot, slot, dict({"publication.name": "bench_pub"}, **(extra or {})))
    before = env.pg_load_begin()
    r = Run(env, "walrelay", [binary or env.args.walrelay, "--config", props], n, prefix=slot, slot=slot,
            end_lsn=end_lsn,
            stderr_path=os.path.join(env.args.work, f"{slot}.log")).go()
    r["options"] = " ".join(f"{k}={v}" for k, v in (extra or {}).items()) or "defaults"
    r["pg_load"] = env.pg_load_end(before)
    env.drop_slot(slot)
    env.delete_topics(slot)
    return r


def debezium_cmd(env, slot, prefix, publication="bench_pub"):
    """The embedded engine's properties file and command line."""
    work = env.args.work
    props = {
        "name": slot,
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "plugin.name": "pgoutput",
        "database.hostname": "127.0.0.1",
        "database.port": str(env.args.pgport),
        "database.user": "postgres",
        "database.password": "",
        "database.dbname": "postgres",
        "topic.prefix": slot,
        "slot.name": slot,
        "publication.name": publication,
        "publication.autocreate.mode": "disabled",
        "table.include.list": "public.outbox",
        "snapshot.mode": "no_data",
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": os.path.join(work, f"{slot}.offsets"),
        "offset.flush.interval.ms": "1000",
        # throughput settings (Debezium docs: max.batch.size, max.queue.size, poll.interval.ms)
        "max.batch.size": "8192",
        "max.queue.size": "32768",
        "poll.interval.ms": "10",
        "transforms": "outbox",
        "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
        "transforms.outbox.route.topic.replacement": prefix + ".${routedByValue}",
        "transforms.outbox.table.expand.json.payload": "false",
        "kafka.bootstrap.servers": env.kafka,
    }
    path = os.path.join(work, f"{slot}.properties")
    with open(path, "w") as f:
        f.write("".join(f"{k}={v}\n" for k, v in props.items()))
    if os.path.exists(props["offset.storage.file.filename"]):
        os.unlink(props["offset.storage.file.filename"])  # a fresh slot: no stored offsets
    jdir = env.args.debezium_dir
    cmd = ["java", "-Xmx2g", "-cp", f"{jdir}/classes:{jdir}/libs/*", "DebeziumBench", path]
    return cmd


def run_debezium(env, n, slot, end_lsn):
    work = env.args.work
    cmd = debezium_cmd(env, slot, slot)
    before = env.pg_load_begin()
    # Debezium confirms the LSN of the last event it processed, not the commit's end: the slot's
    # confirmed_flush_lsn stays just short of end_lsn, so only the Kafka count ends the run.
    r = Run(env, "debezium", cmd, n, prefix=slot, slot=slot, end_lsn=end_lsn,
            stderr_path=os.path.join(work, f"{slot}.log")).go()
    r["options"] = "max.batch.size=8192 max.queue.size=32768 poll.interval.ms=10 -Xmx2g"
    r["pg_load"] = env.pg_load_end(before)
    env.drop_slot(slot)
    env.delete_topics(slot)
    return r


def polling_cmd(env, prefix):
    return [sys.executable, os.path.join(env.args.bench_dir, "polling", "relay.py"), "--dsn",
            env.pg_dsn + " application_name=bench-polling", "--bootstrap", env.kafka, "--topic-prefix", prefix,
            "--batch", "500"]


def run_polling(env, n, prefix):
    """Runs last in a round: it deletes the rows it relays."""
    before = env.pg_load_begin()
    r = Run(env, "polling", polling_cmd(env, prefix), n, prefix=prefix, pg_app="bench-polling",
            stderr_path=os.path.join(env.args.work, f"{prefix}.log")).go()
    r["options"] = "batch 500, DELETE after ack, 1 s idle poll"
    r["pg_load"] = env.pg_load_end(before)
    env.delete_topics(prefix)
    return r


# --- latency ----------------------------------------------------------------

class LatencyConsumer(threading.Thread):
    """Reads the topics from their end; per record: insert time (payload), broker
    log-append time (record timestamp, LogAppendTime topics), arrival time here."""

    def __init__(self, env, prefix, expected):
        super().__init__(daemon=True)
        self.c = Consumer({"bootstrap.servers": env.kafka, "group.id": f"lat-{prefix}", "enable.auto.commit": False,
                           "fetch.wait.max.ms": 5, "fetch.min.bytes": 1})
        self.c.assign([TopicPartition(t, p, -1) for t in env.topics(prefix) for p in range(PARTITIONS)])
        self.expected = expected
        self.samples = []
        self.stop = False

    def run(self):
        # poll() returns at the first record; consume(n, timeout) would wait
        # for n records or the whole timeout, adding up to that to each one.
        while not self.stop and len(self.samples) < self.expected:
            first = self.c.poll(0.1)
            if first is None:
                continue
            for m in [first] + self.c.consume(1000, 0):
                now_us = time.time_ns() // 1000
                if m.error():
                    continue
                ts_us = json.loads(m.value())["ts"]
                self.samples.append((ts_us, m.timestamp()[1] * 1000, now_us))
        self.c.close()


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100.0 * len(xs) + 0.5)) - 1))
    return xs[k]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape_histograms(port):
    """walrelay's /metrics histograms as {name: {le: cumulative count}}; {} if unreachable."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        m = re.match(r'^(walrelay_commit_to_\w+)_bucket\{le="([^"]+)"\} (\S+)$', line)
        if m:
            out.setdefault(m.group(1), {})[m.group(2)] = float(m.group(3))
    return out


def histogram_percentiles(before, after):
    """Upper bucket bounds (ms) holding p50/p99/p99.9 of the observations between two scrapes."""
    res = {}
    for name, buckets in after.items():
        short = name.replace("walrelay_commit_to_", "self_commit_to_").replace("_seconds", "")
        les = sorted(buckets, key=lambda le: float("inf") if le == "+Inf" else float(le))
        counts = [buckets[le] - before.get(name, {}).get(le, 0.0) for le in les]
        total = counts[-1] if counts else 0
        res[f"{short}_count"] = int(total)
        for p in (50, 99, 99.9):
            key = f"{short}_p{p}_le_ms"
            res[key] = None
            for le, c in zip(les, counts):
                if total and c >= p / 100.0 * total:
                    res[key] = None if le == "+Inf" else round(float(le) * 1000, 2)
                    break
    return res


def settle(env, quiet_cores=0.25, need_s=3.0, max_s=60.0):
    """Before a latency run: a checkpoint, then wait until the whole machine has
    been nearly idle for need_s (at most max_s), so that the previous round's
    after-effects (checkpoints, the broker deleting topics, JIT and GC) land in
    no contender's measurement. Returns the seconds waited."""
    t_start = time.monotonic()
    env.q("CHECKPOINT")
    quiet_since = None
    last_t, last_busy = time.monotonic(), machine_busy_s()
    while time.monotonic() - t_start < max_s:
        time.sleep(0.5)
        t, busy = time.monotonic(), machine_busy_s()
        cores = (busy - last_busy) / (t - last_t)
        last_t, last_busy = t, busy
        if cores <= quiet_cores:
            quiet_since = quiet_since or t
            if t - quiet_since >= need_s:
                break
        else:
            quiet_since = None
    return round(time.monotonic() - t_start, 1)


def warm_broker(env, seconds=60, rate=2000):
    """Before the latency section: the broker's JIT warmed by a producer and a
    consumer at a steady rate on a scratch topic, so that no contender's
    latency includes a cold broker (it adds tens of ms to p99 for minutes
    after the broker starts)."""
    prefix = "bench_warm"
    env.create_topics(prefix)
    topics = env.topics(prefix)
    p = Producer({"bootstrap.servers": env.kafka, "enable.idempotence": True, "acks": "all", "linger.ms": 0})
    c = Consumer({"bootstrap.servers": env.kafka, "group.id": "bench-warm", "fetch.wait.max.ms": 5})
    c.assign([TopicPartition(t, p_, -1) for t in topics for p_ in range(PARTITIONS)])
    t0 = time.monotonic()
    i = 0
    while time.monotonic() - t0 < seconds:
        p.produce(topics[i % len(topics)], key=str(i % 10000).encode(), value=b"x" * 200)
        i += 1
        p.poll(0)
        c.consume(100, 0)
        ahead = t0 + i / rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
    p.flush(30)
    c.close()
    env.delete_topics(prefix)
    return i




def server_pids(env, contender, slot):
    """The server processes working for a contender: its walsender (WAL readers) or
    its backends (the polling relay)."""
    if contender == "polling":
        return [pid for (pid,) in env.q("SELECT pid FROM pg_stat_activity WHERE application_name='bench-polling'",
                                        conn=env.mon)]
    pid = env.one("SELECT active_pid FROM pg_replication_slots WHERE slot_name=%s", (slot,), conn=env.mon)
    return [pid] if pid else []


def cpu_of(pids):
    vals = [proc_sched_s(p) for p in pids]
    return sum(v for v in vals if v is not None)


def run_latency(env, contender, rate, seconds, tag, beside=False, idle_s=0, extra=None, binary=None):
    """One contender at `rate` one-row transactions per second. With `beside`, a
    pg_recvlogical reads the same WAL from its own slot at the same time, as the
    reference for CPU per event; the server processes each one keeps busy (its
    walsender, or the polling relay's backends) are measured too. With idle_s,
    the contender's CPU is first measured for that long with no writes."""
    name = f"bench_{tag}"
    prefix = f"bench_{tag}"
    env.reset_outbox()
    env.create_topics(prefix, log_append_time=True)
    work = env.args.work
    admin_port = None
    if contender in ("walrelay", "debezium") or beside:
        env.create_slot_and_publication(name)
    if contender == "walrelay":
        admin_port = free_port()
        cmd = [binary or env.args.walrelay, "--config",
               walrelay_props(env, name, prefix, dict({"admin.listen": f"127.0.0.1:{admin_port}"}, **(extra or {})))]
    elif contender == "debezium":
        cmd = debezium_cmd(env, name, prefix, publication=name)
    elif contender == "polling":
        cmd = polling_cmd(env, prefix)
    else:
        raise ValueError(contender)
    ref_slot = f"{name}_recv"
    ref = None
    if beside:
        env.create_slot(ref_slot)
        ref = subprocess.Popen(recvlogical_cmd(env, ref_slot, name, ["proto_version=1"]), stdout=subprocess.DEVNULL,
                               stderr=open(os.path.join(work, f"{ref_slot}.log"), "w"))
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, f"{name}.log"), "w"))
    n = rate * seconds
    cpu = {}
    try:
        # Warm: one event to each of the 4 topics (Debezium takes seconds to start, and
        # librdkafka fetches a new topic's metadata up to 1 s late), then measure from there.
        env.q("CALL bench_paced(4, 1)")
        deadline = time.monotonic() + 180
        while env.topic_count(prefix) < 4 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        # Warm-up at the measured rate, not measured: the broker's JIT, the
        # contender's and the walsender's caches reach their steady state (a
        # cold broker adds tens of ms to the first seconds' tail). Then wait
        # until all of it is in Kafka, and for a quiet machine.
        warm_s = 10 if rate <= 1000 else 5
        warm_rate = max(rate, 100)  # the lowest rates warm at 100/s: a few events warm nothing
        env.q("CALL bench_paced(%s, %s)", (warm_rate, warm_s))
        deadline = time.monotonic() + 180
        while env.topic_count(prefix) < 4 + warm_rate * warm_s and time.monotonic() < deadline \
                and proc.poll() is None:
            time.sleep(0.2)
        settled_s = settle(env)
        mine = server_pids(env, contender, name)
        theirs = server_pids(env, "pg_recvlogical", ref_slot) if beside else []

        def cpu_now():
            """CPU seconds so far of the contender, its server processes, and (beside) pg_recvlogical and its walsender."""
            now = {"relay": proc_sched_s(proc.pid), "relay_server": cpu_of(mine)}
            if ref:
                now.update(recvlogical=proc_sched_s(ref.pid), recvlogical_server=cpu_of(theirs))
            return now

        def spent(before, after):
            return {k: after[k] - before[k] for k in before if before[k] is not None and after[k] is not None}

        if idle_s:
            i0 = cpu_now()
            time.sleep(idle_s)
            for k, s in spent(i0, cpu_now()).items():
                cpu[f"idle_{k}_cpu_ms_per_s"] = round(s * 1000 / idle_s, 2)
        cons = LatencyConsumer(env, prefix, n)
        cons.start()
        time.sleep(2)  # consumer assigned
        c0 = cpu_now()
        hist0 = scrape_histograms(admin_port) if admin_port else {}
        t0 = time.monotonic()
        env.q("CALL bench_paced(%s, %s)", (rate, seconds))
        offered = n / (time.monotonic() - t0)
        cons.join(timeout=60)
        cons.stop = True
        c1 = cpu_now()
        hist1 = scrape_histograms(admin_port) if admin_port else {}
        for k, s in spent(c0, c1).items():
            cpu[f"{k}_cpu_us_per_event"] = round(s * 1e6 / n, 1)
            cpu[f"{k}_cpu_pct"] = round(s * 100 / seconds, 2)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        if ref:
            ref.send_signal(signal.SIGTERM)
            ref.wait(timeout=30)
    s = cons.samples
    with open(os.path.join(work, f"{name}.samples.json"), "w") as f:
        json.dump(s, f)  # (insert µs, log-append µs, received µs) per record, for a closer look
    append_ms = [(a - t) / 1000.0 for t, a, _ in s]
    recv_ms = [(r - t) / 1000.0 for t, _, r in s]
    res = {"contender": contender, "rate": rate, "seconds": seconds, "events": n, "received": len(s),
           "offered_events_per_s": round(offered), "settled_s": settled_s,
           "relay_cpu_us_per_event": cpu.get("relay_cpu_us_per_event")}
    res.update(cpu)
    for label, xs in (("append", append_ms), ("consumer", recv_ms)):
        for p in (50, 99, 99.9):
            v = pct(xs, p)
            res[f"{label}_p{p}_ms"] = round(v, 2) if v is not None else None
        res[f"{label}_max_ms"] = round(max(xs), 2) if xs else None
    # walrelay's own histograms over the same interval (bucket upper bounds):
    # commit -> received by walrelay, commit -> acknowledged by Kafka.
    if hist1:
        res.update(histogram_percentiles(hist0, hist1))
    if contender in ("walrelay", "debezium") or beside:
        env.drop_slot(name)
    if beside:
        env.drop_slot(ref_slot)
    env.delete_topics(prefix)
    return res


def run_txn_floor(env, rate, seconds, boundary_ms, tag):
    """The broker's floor for exactly-once latency: a plain librdkafka
    transactional producer (this venv's confluent-kafka), no PostgreSQL and no
    walrelay, sending `rate` records/s to the latency topics in transactions
    of `boundary_ms` (counted from each one's first record, walrelay's rule),
    each with one record to a compacted offsets topic as walrelay's carry.
    A record's time is when it was due, so the time it waits while the
    producer blocks in commit_transaction counts, as an event waiting for a
    commit does in walrelay. The same consumer (read_committed) measures it."""
    prefix = f"bench_{tag}"
    env.create_topics(prefix, log_append_time=True)
    offsets = f"{prefix}.offsets"
    env.admin.create_topics([NewTopic(offsets, 1, 1, config={"cleanup.policy": "compact"})])[offsets].result()
    topics = env.topics(prefix)
    p = Producer({"bootstrap.servers": env.kafka, "transactional.id": prefix, "linger.ms": 0,
                  "max.in.flight.requests.per.connection": 1})
    p.init_transactions()

    def paced(n):
        t0 = time.monotonic()
        wall0 = time.time_ns() // 1000
        began = None
        for i in range(n):
            due = t0 + i / rate
            ahead = due - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
            if began is None:
                p.begin_transaction()
                began = time.monotonic()
            ts = wall0 + int(i * 1e6 / rate)
            p.produce(topics[i % len(topics)], key=f"k{i % 7}".encode(), value=json.dumps({"ts": ts}).encode())
            p.poll(0)
            if time.monotonic() - began >= boundary_ms / 1000.0 or i == n - 1:
                p.produce(offsets, key=b"position", value=str(i).encode())
                p.commit_transaction()
                began = None

    paced(rate * 10)  # warm-up at the rate, not measured
    n = rate * seconds
    cons = LatencyConsumer(env, prefix, n)
    cons.start()
    time.sleep(2)  # consumer assigned
    t0 = time.monotonic()
    cpu0 = time.process_time()
    paced(n)
    offered = n / (time.monotonic() - t0)
    cons.join(timeout=60)
    cons.stop = True
    s = cons.samples
    res = {"contender": "txn_producer", "rate": rate, "seconds": seconds, "events": n, "received": len(s),
           "offered_events_per_s": round(offered), "boundary_ms": boundary_ms,
           "bench_process_cpu_us_per_event": round((time.process_time() - cpu0) * 1e6 / n, 1),
           "librdkafka": confluent_kafka_version()}
    for label, xs in (("append", [(a - t) / 1000.0 for t, a, _ in s]), ("consumer", [(r - t) / 1000.0 for t, _, r in s])):
        for q in (50, 99, 99.9):
            v = pct(xs, q)
            res[f"{label}_p{q}_ms"] = round(v, 2) if v is not None else None
        res[f"{label}_max_ms"] = round(max(xs), 2) if xs else None
    env.delete_topics(prefix)
    env.admin.delete_topics([offsets])
    return res


# --- main -------------------------------------------------------------------

def binary_version(path):
    """What `walrelay --version` says: its version and the librdkafka and libpq it loaded."""
    try:
        return subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError as e:
        return f"? ({e})"


def versions(env, args, variants):
    v = {"postgresql": env.one("SHOW server_version"), "kafka": args.kafka_version or "?",
         "walrelay": binary_version(args.walrelay), "kafka_clients_python": confluent_kafka_version(),
         "variants": {name: binary_version(b) for name, b in variants},
         # each binary's build (CMAKE_BUILD_TYPE, its source's commit) and the harness's checkout
         "builds": {name: provenance.build_info(b) for name, b in [("walrelay", args.walrelay)] + list(variants)},
         "bench_checkout": provenance.git_commit(os.path.dirname(os.path.abspath(__file__)))}
    if args.debezium_dir:
        # the cache folder is named for its versions: debezium-<version>-kafka-<kafka-clients version>
        m = re.search(r"debezium-(.+?)-kafka-(.+)$", os.path.basename(os.path.normpath(args.debezium_dir)))
        v["debezium"] = f"{m.group(1)} (kafka-clients {m.group(2)})" if m else args.debezium_dir
        try:
            java = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=10).stderr
            v["java"] = java.splitlines()[0] if java else "?"
        except OSError:
            v["java"] = "?"
    if args.registry:
        import urllib.request
        try:
            # Apicurio's own API, beside its Confluent-compatible one
            base = args.registry.split("/apis/")[0]
            with urllib.request.urlopen(f"{base}/apis/registry/v3/system/info", timeout=10) as r:
                info = json.loads(r.read())
            v["schema_registry"] = f"{info.get('name', '?')} {info.get('version', '?')}"
        except Exception:  # noqa: BLE001 - another registry: recorded by its URL
            v["schema_registry"] = args.registry
    if args.nats and args.rabbitmq:
        for key, cmd in (("nats_server", ["nats-server", "--version"]),
                         ("rabbitmq", ["dpkg-query", "-W", "-f=${Version}", "rabbitmq-server"]),
                         ("nats_c", ["pkg-config", "--modversion", "libnats"]),
                         ("rabbitmq_c", ["pkg-config", "--modversion", "librabbitmq"]),
                         ("redis", ["redis-server", "--version"]),
                         ("hiredis", ["pkg-config", "--modversion", "hiredis"])):
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
                if key == "redis" and " v=" in out:
                    out = out.split(" v=", 1)[1].split()[0]
                v[key] = out.replace("nats-server: ", "") or "?"
            except OSError:
                v[key] = "?"
    try:
        v["compiler"] = subprocess.run(["c++", "--version"], capture_output=True, text=True,
                                       timeout=10).stdout.splitlines()[0]
    except (OSError, IndexError):
        v["compiler"] = "?"
    return v


def summarize(runs):
    """Median and spread per (workload, contender, options)."""
    groups = {}
    for r in runs:
        groups.setdefault((r["workload"], r["contender"], r.get("options", "")), []).append(r)
    out = []
    for (w, c, o), rs in groups.items():
        row = {"workload": w, "contender": c, "options": o, "repeats": len(rs)}
        for k in ("events_per_s", "total_events_per_s", "startup_s", "cpu_us_per_event", "peak_rss_mib",
                  "pg_backend_cpu_us_per_event"):
            vals = [r[k] for r in rs if r.get(k) is not None]
            if vals:
                row[k + "_median"] = statistics.median(vals)
                row[k + "_min"] = min(vals)
                row[k + "_max"] = max(vals)
        out.append(row)
    return out


def write_csv(path, rows):
    keys = []
    for r in rows:
        for k in r:
            if k not in keys and not isinstance(r[k], (dict, list)):
                keys.append(k)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--pgport", required=True)
    ap.add_argument("--kafka", required=True)
    ap.add_argument("--walrelay", required=True)
    ap.add_argument("--pg-recvlogical", required=True)
    ap.add_argument("--debezium-dir", default="")
    ap.add_argument("--out", required=True)
    ap.add_argument("--kafka-pid", type=int, default=0, help="the broker's pid, to measure its CPU")
    ap.add_argument("--work", required=True)
    ap.add_argument("--repeats", type=int, default=0,
                    help="repeats of every section (default: 3 for throughput and librdkafka, 2 for latency, "
                         "1 for options, sidecar and tableless; the full run stays under an hour on 2 cores)")
    ap.add_argument("--only", default="",
                    help="comma list of sections: librdkafka,throughput,options,latency,sidecar,tableless,snapshot, and "
                         "txn-floor, eos-throughput, retention (not in a full run); results then go to "
                         "<sections>.json")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=BINARY",
                    help="librdkafka section: a walrelay build to measure (e.g. 'librdkafka 2.0.2=build-x/walrelay'); "
                         "every variant runs in each round, interleaved")
    ap.add_argument("--kafka-version", default="", help="the broker's version, recorded with the results")
    ap.add_argument("--tag", default="", help="results file name (default: full, quick or the --only sections)")
    ap.add_argument("--walrelay-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a walrelay setting for every walrelay run (e.g. kafka.linger.ms=1)")
    ap.add_argument("--rates", default="",
                    help="latency and sidecar: comma list of the rates to run (default 1000,10000 and 10,100,1000,5000)")
    ap.add_argument("--events", type=int, default=0, help="development: one workload of this many events")
    ap.add_argument("--tx-size", type=int, default=100, help="development: rows per transaction with --events")
    ap.add_argument("--floor-boundary-ms", type=float, default=10,
                    help="txn-floor: transaction length, as walrelay's transaction.boundary.interval.ms")
    ap.add_argument("--contenders", default="pg_recvlogical,walrelay,polling,debezium")
    ap.add_argument("--nats", default="", help="sinks: a NATS server with JetStream (scripts/services.sh start nats)")
    ap.add_argument("--rabbitmq", default="", help="sinks: a RabbitMQ node, host:port (scripts/services.sh start rabbitmq)")
    ap.add_argument("--redis", default="", help="sinks: a Redis server, host:port (scripts/services.sh start redis)")
    ap.add_argument("--http", default="", help="sinks: the tests' HTTP receiver, host:port (scripts/services.sh start http)")
    ap.add_argument("--sqs", default="", help="sinks: ElasticMQ's endpoint URL (scripts/services.sh start sqs)")
    ap.add_argument("--registry", default="",
                    help="formats: a schema registry's Confluent-compatible API (scripts/services.sh start registry)")
    args = ap.parse_args()
    args.bench_dir = os.path.dirname(os.path.abspath(__file__))
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.work, exist_ok=True)
    env = Env(args)
    sections = set(args.only.split(",")) if args.only else {"librdkafka", "throughput", "options", "formats",
                                                             "latency", "sidecar", "tableless", "sinks", "snapshot"}
    default_repeats = {"throughput": 3, "librdkafka": 3, "latency": 2, "txn-floor": 3, "eos-throughput": 3,
                       "formats": 3, "sinks": 3, "snapshot": 3}
    variants = [tuple(v.split("=", 1)) for v in args.variant]
    if not variants:
        sections.discard("librdkafka")
    if not args.registry:
        sections.discard("formats")
    if not (args.nats and args.rabbitmq):
        sections.discard("sinks")
    contenders = sorted(args.contenders.split(","), key=lambda c: c == "polling")  # polling last
    if args.quick:
        workloads = [("20k_tx100", 20000, 100)]
        contenders = [c for c in contenders if c != "debezium"]
        sections = {"throughput"}
        repeats = 1
    else:
        workloads = [("1M_tx100", 1000000, 100), ("100k_tx1", 100000, 1)]
        if args.events:
            workloads = [(f"{args.events}_tx{args.tx_size}", args.events, args.tx_size)]
    def reps(section):
        if args.quick:
            return 1
        return args.repeats or default_repeats.get(section, 1)
    result = {"machine": provenance.machine(), "started": provenance.now(), "quick": args.quick,
              "argv": sys.argv[1:],
              "versions": versions(env, args, variants),
              "runs": [], "option_runs": [], "latency": [], "sidecar": [], "tableless": [], "librdkafka": [],
              "formats": [], "sinks": [], "snapshot": [], "retention": []}
    seq = 0

    def save():
        tag = args.tag or ("quick" if args.quick else "_".join(sorted(sections)) if args.only else "full")
        with open(os.path.join(args.out, f"{tag}.json"), "w") as f:
            json.dump(result, f, indent=1)
        if result["runs"] or result["option_runs"]:
            write_csv(os.path.join(args.out, f"{tag}_runs.csv"), result["runs"] + result["option_runs"])
            result["summary"] = summarize(result["runs"] + result["option_runs"])
            write_csv(os.path.join(args.out, f"{tag}_summary.csv"), result["summary"])
        for section in ("latency", "sidecar", "librdkafka", "formats", "sinks", "snapshot"):
            if result[section]:
                name = tag if tag == section else f"{tag}_{section}"
                write_csv(os.path.join(args.out, f"{name}.csv"), result[section])
        with open(os.path.join(args.out, f"{tag}.json"), "w") as f:
            json.dump(result, f, indent=1)

    def record_rate(r, key, contender, rep):
        """One run at a fixed rate (latency, sidecar) into result[key]."""
        r["repeat"] = rep + 1
        if contender == "walrelay" and args.walrelay_set:
            r["options"] = " ".join(args.walrelay_set)
        log(json.dumps(r))
        result[key].append(r)
        save()

    def record(r, key, wname, rep):
        r.update(workload=wname, repeat=rep + 1)
        log(json.dumps({k: v for k, v in r.items() if k != "pg_load"}))
        result[key].append(r)
        save()

    def both_modes(prefix, n, extra, rep, key):
        """n events in 100-row transactions relayed from one WAL by each build
        (--variant), at least once and exactly once, with `extra` settings.
        Kafka's offsets count transaction markers too, so both modes are timed
        to the slot confirmed at the end, which exactly once reaches only once
        the last transaction is committed: from launch (confirmed_events_per_s)
        and from the first record in Kafka (first_to_confirmed_events_per_s)."""
        names = {(v, m): f"{prefix}_{i}_{m}" for i, (v, _) in enumerate(variants) for m in ("alo", "eos")}
        end_lsn = prepare_round(env, n, 100, list(names.values()), list(names.values()))
        for (vname, mode), slot in names.items():
            settings = dict(extra, **({"exactly.once.support": "required"} if mode == "eos" else {}))
            r = run_walrelay(env, n, slot, end_lsn, extra=settings or None, binary=dict(variants)[vname])
            t, s0 = r.get("launch_to_slot_confirmed_s"), r.get("startup_s")
            r.update(kind=f"throughput_{mode}", variant=vname, round=rep + 1,
                     confirmed_events_per_s=round(n / t) if t else None,
                     first_to_confirmed_events_per_s=round(n / (t - s0)) if t and s0 is not None and t > s0 else None)
            r.pop("pg_load", None)
            log(json.dumps(r))
            result[key].append(r)
            save()

    if "librdkafka" in sections:
        # The goals that waited for a newer librdkafka, each walrelay build
        # (--variant) in every round, beside the broker's own floor, rounds
        # interleaved so that a drift of the machine touches all alike:
        #   eos_1000: exactly once, 1,000 one-row tx/s, 10 ms boundary (after 20 s idle)
        #   alo_1000: at least once, the same rate (after 20 s idle): CPU per lone event
        #   floor:    a transactional producer alone, same topics, rate and boundary
        #   throughput: 200,000 events in 100-row transactions, both modes (exactly once
        #               with its default boundary), one WAL
        eos = {"exactly.once.support": "required", "transaction.boundary.interval.ms": "10"}
        log("librdkafka: warming the broker for 60 s")
        warm_broker(env)
        for rep in range(reps("librdkafka")):
            seq += 1
            log(f"librdkafka round {rep + 1}: txn floor")
            r = run_txn_floor(env, 1000, 30, 10, f"floor_{seq}")
            r.update(kind="floor", variant="txn producer alone", round=rep + 1)
            log(json.dumps(r))
            result["librdkafka"].append(r)
            save()
            for vname, vbin in variants:
                for kind, extra in (("eos_1000", eos), ("alo_1000", {})):
                    seq += 1
                    log(f"librdkafka round {rep + 1}: {vname} {kind}")
                    r = run_latency(env, "walrelay", 1000, 30, f"rdk_{seq}", idle_s=20, extra=extra, binary=vbin)
                    r.update(kind=kind, variant=vname, round=rep + 1,
                             options=" ".join(f"{k}={v}" for k, v in extra.items()) or "defaults")
                    log(json.dumps(r))
                    result["librdkafka"].append(r)
                    save()
            seq += 1
            log(f"librdkafka round {rep + 1}: throughput, 200,000 events in 100-row transactions")
            # exactly once with its default 100 ms boundary here: throughput, not latency
            both_modes(f"bench_rdkt_{seq}", 200000, {}, rep, "librdkafka")

    if "snapshot" in sections:
        # The initial snapshot against streaming, on the same rows in each
        # round: the stream's slot is made before the rows (walrelay decodes
        # them from the WAL), the snapshot's slot by walrelay after them
        # (snapshot.mode=initial reads them from the table). Both timed from
        # the first record in Kafka to the last.
        n = args.events or 1000000
        # Run alone (--only snapshot), the broker would be cold: its JIT
        # multiplies its CPU per event several times for the first minute.
        # A round of both kinds first, not recorded.
        seq += 1
        log("snapshot: a warm-up round of 200,000 events, not recorded")
        warm_stream, warm_snap = f"bench_snwst_{seq}", f"bench_snwsn_{seq}"
        end_lsn = prepare_round(env, 200000, 100, [warm_stream], [warm_stream, warm_snap])
        run_walrelay(env, 200000, warm_stream, end_lsn)
        props = walrelay_props(env, warm_snap, warm_snap, {"publication.name": "bench_pub", "snapshot.mode": "initial"})
        Run(env, "walrelay", [args.walrelay, "--config", props], 200000, prefix=warm_snap,
            stderr_path=os.path.join(args.work, f"{warm_snap}.log")).go()
        env.drop_slot(warm_snap)
        env.delete_topics(warm_snap)
        for rep in range(reps("snapshot")):
            seq += 1
            stream_slot, snap_slot = f"bench_snst_{seq}", f"bench_snsn_{seq}"
            log(f"snapshot round {rep + 1}: {n} rows, streamed and then read by a snapshot")
            end_lsn = prepare_round(env, n, 100, [stream_slot], [stream_slot, snap_slot])
            r = run_walrelay(env, n, stream_slot, end_lsn)
            r.update(kind="streaming", round=rep + 1)
            r.pop("pg_load", None)
            record(r, "snapshot", f"{n}_tx100", rep)
            props = walrelay_props(env, snap_slot, snap_slot, {"publication.name": "bench_pub",
                                                               "snapshot.mode": "initial"})
            r = Run(env, "walrelay", [args.walrelay, "--config", props], n, prefix=snap_slot,
                    stderr_path=os.path.join(args.work, f"{snap_slot}.log")).go()
            r.update(kind="snapshot", options="snapshot.mode=initial", round=rep + 1)
            env.drop_slot(snap_slot)
            env.delete_topics(stream_slot)
            env.delete_topics(snap_slot)
            record(r, "snapshot", f"{n}_tx100", rep)

    if "eos-throughput" in sections:
        # Explicit only: exactly once against at least once at 100-row
        # transactions on 1,000,000 events, each build, with status updates
        # every 100 ms so that the slot's confirmation (the end of a run)
        # lags the work by at most that, timed from the first record in
        # Kafka (start-up apart, reported as startup_s).
        result.setdefault("eos_throughput", [])
        n = args.events or 1000000
        for rep in range(reps("eos-throughput")):
            seq += 1
            log(f"eos-throughput round {rep + 1}: {n} events in 100-row transactions")
            both_modes(f"bench_eost_{seq}", n, {"status.update.interval.ms": "100"}, rep, "eos_throughput")

    if "throughput" in sections:
        if not args.debezium_dir:
            contenders = [c for c in contenders if c != "debezium"]
        repeats = reps("throughput")
        for rep in range(repeats):
            for wname, n, tx in workloads:
                seq += 1
                slots = {c: f"bench_{c}_{seq}" for c in contenders}
                wal = [c for c in contenders if c != "polling"]
                log(f"throughput {wname} repeat {rep + 1}/{repeats}: {', '.join(contenders)}")
                end_lsn = prepare_round(env, n, tx, [slots[c] for c in wal],
                                        [slots[c] for c in contenders if c != "pg_recvlogical"])
                for c in contenders:  # polling last: it deletes the rows
                    log(f"  {c}")
                    if c == "pg_recvlogical":
                        r = run_pg_recvlogical(env, n, slots[c], end_lsn, ["proto_version=1"])
                    elif c == "walrelay":
                        r = run_walrelay(env, n, slots[c], end_lsn)
                    elif c == "debezium":
                        r = run_debezium(env, n, slots[c], end_lsn)
                    elif c == "polling":
                        r = run_polling(env, n, slots[c])
                    record(r, "runs", wname, rep)

    if "options" in sections:
        # What lowers the walsender's CPU per row: protocol version and binary mode.
        wname, n, tx = ("200k_tx100", 200000, 100)
        repeats = reps("options")
        variants_ = [["proto_version=1"], ["proto_version=3"], ["proto_version=1", "binary=true"],
                    ["proto_version=3", "binary=true"]]
        for rep in range(repeats):
            seq += 1
            names = [f"bench_opt{i}_{seq}" for i in range(len(variants_))] + [f"bench_optwr_{seq}",
                                                                                f"bench_optwb_{seq}"]
            log(f"options {wname} repeat {rep + 1}/{repeats}")
            end_lsn = prepare_round(env, n, tx, names, names[-2:])
            for i, opts in enumerate(variants_):
                record(run_pg_recvlogical(env, n, names[i], end_lsn, opts), "option_runs", wname, rep)
            record(run_walrelay(env, n, names[-2], end_lsn), "option_runs", wname, rep)
            record(run_walrelay(env, n, names[-1], end_lsn, {"pgoutput.binary": "true"}), "option_runs", wname, rep)

    if "formats" in sections:
        # What encoding by a registered schema costs: one WAL of 200,000
        # events in 100-row transactions, relayed as text (the payload as
        # stored) and encoded by each registry format, rounds interleaved.
        wname, n, tx = ("200k_tx100", 200000, 100)
        repeats = reps("formats")
        formats = ["string", "avro", "json-schema", "protobuf"]
        for rep in range(repeats):
            seq += 1
            names = {fmt: f"bench_fmt{i}_{seq}" for i, fmt in enumerate(formats)}
            log(f"formats {wname} repeat {rep + 1}/{repeats}")
            end_lsn = prepare_round(env, n, tx, list(names.values()), list(names.values()))
            for fmt, slot in names.items():
                extra = None
                if fmt != "string":
                    register_schemas(args.registry, slot, fmt)
                    extra = {"value.converter": FORMAT_SCHEMAS[fmt][0],
                             "value.converter.schema.registry.url": args.registry}
                r = run_walrelay(env, n, slot, end_lsn, extra=extra)
                r.update(kind="format", format=fmt)
                r.pop("pg_load", None)
                record(r, "formats", wname, rep)

    if "sinks" in sections:
        # Each broker beside Kafka on one WAL: 300,000 events in 100-row
        # transactions, relayed to Kafka, NATS JetStream and RabbitMQ by the
        # same walrelay, rounds interleaved.
        wname, n, tx = ("300k_tx100", 300000, 100)
        repeats = reps("sinks")
        sinks = (["kafka", "nats-jetstream", "rabbitmq"] + (["redis"] if args.redis else []) +
                 (["http"] if args.http else []) + (["sqs"] if args.sqs else []))
        for rep in range(repeats):
            seq += 1
            names = {s: f"bench_sink{i}_{seq}" for i, s in enumerate(sinks)}
            log(f"sinks {wname} repeat {rep + 1}/{repeats}")
            end_lsn = prepare_round(env, n, tx, list(names.values()), [names["kafka"]])
            for sink, slot in names.items():
                if sink == "kafka":
                    r = run_walrelay(env, n, slot, end_lsn, extra={"status.update.interval.ms": "100"})
                    # One measure for the three: launch to the slot confirmed past the end.
                    span = r.get("launch_to_slot_confirmed_s")
                    r["events_per_s"] = round(n / span) if span else None
                else:
                    r = run_walrelay_sink(env, n, slot, end_lsn, sink)
                r.update(kind="sink", sink=sink)
                r.pop("pg_load", None)
                record(r, "sinks", wname, rep)
        # The brokers' own tools, publishing the same kind of messages the same
        # way (persistent, acknowledged, ~220 bytes), on the same machine.
        tools = {}
        try:
            out = subprocess.run([os.path.join(args.bench_dir, "rabbitmq_perftest.sh"), args.rabbitmq, str(n)],
                                 capture_output=True, text=True, timeout=600).stdout
            m = re.search(r"sending rate avg: (\d+) msg/s", out)
            tools["rabbitmq_perftest_msgs_per_s"] = int(m.group(1)) if m else None
        except (OSError, subprocess.TimeoutExpired) as e:
            log(f"sinks: RabbitMQ PerfTest did not run: {e}")
        try:
            out = subprocess.run([os.path.join(args.bench_dir, "nats_bench.sh"), args.nats, str(n)],
                                 capture_output=True, text=True, timeout=600).stdout
            m = re.search(r"stats: ([\d,]+) msgs/sec", out)
            tools["nats_bench_msgs_per_s"] = int(m.group(1).replace(",", "")) if m else None
        except (OSError, subprocess.TimeoutExpired) as e:
            log(f"sinks: nats bench did not run: {e}")
        if args.redis:
            # redis-benchmark: XADD of ~220-byte entries, 16 commands pipelined
            # per connection, one connection (walrelay's one worker).
            try:
                host, port = args.redis.rsplit(":", 1)
                out = subprocess.run(["redis-benchmark", "-h", host, "-p", port, "-c", "1", "-P", "16", "-n", str(n),
                                      "-q", "XADD", "redisbench", "*", "value", "x" * 220],
                                     capture_output=True, text=True, timeout=600).stdout
                m = re.findall(r"([\d.]+) requests per second", out)
                tools["redis_benchmark_xadd_per_s"] = round(float(m[-1])) if m else None
                subprocess.run(["redis-cli", "-h", host, "-p", port, "DEL", "redisbench"], capture_output=True)
            except (OSError, subprocess.TimeoutExpired) as e:
                log(f"sinks: redis-benchmark did not run: {e}")
        if args.http:
            # The receiver alone, POSTed by curl (libcurl, as walrelay's sink):
            # the same batches of 200 values, 16 requests at once, kept-alive.
            try:
                tools["http_curl_events_per_s"] = curl_post_bench(env, n, 200, 16)
            except (OSError, subprocess.SubprocessError) as e:
                log(f"sinks: the curl reference did not run: {e}")
        if args.sqs:
            # ElasticMQ alone, fed by boto3 (the AWS SDK): SendMessageBatch of 10
            # to a FIFO queue, 16 calls at once, each message its own group.
            try:
                tools["sqs_boto3_msgs_per_s"] = boto3_sqs_bench(env, min(n, 50000), 16)
            except (OSError, subprocess.SubprocessError) as e:
                log(f"sinks: the boto3 reference did not run: {e}")
        log(f"sinks: the brokers' own tools: {tools}")
        result["sinks_broker_tools"] = tools
        save()

    if "latency" in sections:
        # The two fixed rates, or the given ones (20 s each; e.g. a ladder
        # looking for the highest rate a contender sustains on this machine).
        if args.rates:
            rates = [(int(r), {1000: 30, 10000: 15}.get(int(r), 20)) for r in args.rates.split(",")]
        else:
            rates = [(1000, 30), (10000, 15)]
        log("latency: warming the broker for 60 s")
        warm_broker(env)
        repeats = reps("latency")
        for rep in range(repeats):
            for c in [x for x in ("walrelay", "debezium", "polling") if x in contenders]:
                for rate, secs in rates:
                    seq += 1
                    log(f"latency {c} {rate}/s for {secs} s, repeat {rep + 1}/{repeats}")
                    record_rate(run_latency(env, c, rate, secs, f"lat_{c}_{seq}"), "latency", c, rep)

    if "txn-floor" in sections:
        # What the broker gives a transactional producer alone, beside
        # walrelay's exactly-once latency (same topics, consumer and rate).
        rates = [int(r) for r in args.rates.split(",")] if args.rates else [1000]
        log("txn-floor: warming the broker for 60 s")
        warm_broker(env)
        result.setdefault("txn_floor", [])
        repeats = reps("txn-floor")
        for rep in range(repeats):
            for rate in rates:
                seq += 1
                log(f"txn-floor {rate}/s, {args.floor_boundary_ms} ms transactions, repeat {rep + 1}/{repeats}")
                r = run_txn_floor(env, rate, 30, args.floor_boundary_ms, f"floor_{seq}")
                r["repeat"] = rep + 1
                log(json.dumps(r))
                result["txn_floor"].append(r)
                save()

    if "sidecar" in sections:
        # What a sidecar costs at everyday rates: one-row transactions, each
        # contender with a pg_recvlogical reading the same WAL beside it (the
        # floor: a client that only receives), CPU of both and of the server
        # process working for each, and the latency. Idle CPU once per contender.
        rates = [int(r) for r in args.rates.split(",")] if args.rates else [10, 100, 1000, 5000]
        secs = {10: 30, 100: 30, 1000: 30}
        repeats = reps("sidecar")
        sidecars = [x for x in ("walrelay", "debezium", "polling") if x in contenders]
        if not args.debezium_dir:
            sidecars = [x for x in sidecars if x != "debezium"]
        if "latency" not in sections and "librdkafka" not in sections:
            log("sidecar: warming the broker for 30 s")
            warm_broker(env, seconds=30)
        for rep in range(repeats):
            for c in sidecars:
                for i, rate in enumerate(rates):
                    seq += 1
                    log(f"sidecar {c} {rate}/s, repeat {rep + 1}/{repeats}")
                    r = run_latency(env, c, rate, secs.get(rate, 20), f"side_{c}_{seq}", beside=True,
                                    idle_s=10 if i == 0 else 0)
                    record_rate(r, "sidecar", c, rep)

    if "tableless" in sections:
        # Explicit only (--only tableless): the table against logical messages.
        import tableless
        n_writer = args.events or 20000
        repeats = reps("tableless")
        for rep in range(repeats):
            for kind in ("table", "message"):
                r = tableless.writer_side(env, kind, n_writer, log, psycopg)
                r["repeat"] = rep + 1
                result["tableless"].append(r)
                save()
            for kind in ("table", "message"):
                seq += 1
                r = tableless.relay_side(env, kind, 200000, 100, seq, run_walrelay, log)
                r["repeat"] = rep + 1
                log(json.dumps({k: v for k, v in r.items() if k != "pg_load"}))
                result["tableless"].append(r)
                save()
        write_csv(os.path.join(args.out, "tableless.csv"), result["tableless"])

    if "retention" in sections:
        # Explicit only (--only retention): the outbox kept small under load,
        # walrelay's deletes beside the polling relay's.
        import retention
        rate = int(args.rates.split(",")[0]) if args.rates else 1000
        seconds = args.events // rate if args.events else 120
        series = []
        for rep in range(reps("retention")):
            for contender in [c for c in ("walrelay", "polling") if c in args.contenders.split(",")]:
                r, samples = retention.run(env, contender, rate, seconds, log, psycopg, walrelay_props, polling_cmd,
                                           free_port, proc_sched_s)
                r["repeat"] = rep + 1
                result["retention"].append(r)
                series += [dict(s, repeat=rep + 1) for s in samples]
                save()
        tag = args.tag or "retention"
        write_csv(os.path.join(args.out, f"{tag}.csv"),
                  [{k: v for k, v in r.items() if k != "statements"} for r in result["retention"]])
        write_csv(os.path.join(args.out, f"{tag}_series.csv"), series)
        result["retention_series"] = series
        save()

    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    save()
    if args.quick:
        bad = [r for r in result["runs"] if (r["contender"] != "pg_recvlogical" and r["events_in_kafka"] != r["events"])
               or (r["contender"] == "pg_recvlogical" and r["exit_code"] != 0)]
        if bad or not result["runs"]:
            log(f"FAILED: {json.dumps(bad)}")
            return 1
        log(f"quick: {len(result['runs'])} contenders relayed every event")
    return 0


def confluent_kafka_version():
    import confluent_kafka
    v = confluent_kafka.version()  # a string since 2.x; (string, int) before
    return f"confluent-kafka {v if isinstance(v, str) else v[0]}, librdkafka {confluent_kafka.libversion()[0]}"


if __name__ == "__main__":
    sys.exit(main())
