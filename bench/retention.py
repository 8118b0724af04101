"""Outbox retention under load (bench.py --only retention): writers at a fixed
rate for several retention periods, and what keeping the table small costs.

Two contenders, each on a fresh outbox with autovacuum on (as a production
outbox has it; the other sections turn it off):
- walrelay with table.retention.policy=delete (table.retention.ms 10 s,
  a run every second): it deletes what the broker acknowledged;
- the polling relay (bench/polling/relay.py), which deletes each batch once
  published, as polling relays do.

Per run: the outbox's size on disk and its row count every second (the
series goes to retention_series.csv, for the plot), every event counted in
Kafka by the bench's own consumer (confluent-kafka), and from
pg_stat_statements the statements that remove rows: calls, rows, execution
time and WAL bytes, so the cost per row removed is the server's own count.
The polling relay's SELECT ... FOR UPDATE is listed beside its DELETE: it
writes WAL too (the row locks), and it is part of what its cleaning costs.
"""
import os
import signal
import subprocess
import threading
import time

# A production outbox: autovacuum on, triggered early (the table is small and
# churns).
AUTOVACUUM = ("ALTER TABLE outbox SET (autovacuum_enabled = true, autovacuum_vacuum_threshold = 1000, "
              "autovacuum_vacuum_scale_factor = 0.1)")


class Sampler(threading.Thread):
    """The outbox's size (pg_total_relation_size, no scan) and rows, every second."""

    def __init__(self, env, psycopg, label):
        super().__init__(daemon=True)
        self.conn = psycopg.connect(env.pg_dsn + " application_name=bench-sampler", autocommit=True)
        self.label = label
        self.samples = []
        self.stop = False

    def run(self):
        t0 = time.monotonic()
        while not self.stop:
            size, rows = self.conn.execute(
                "SELECT pg_total_relation_size('public.outbox'), (SELECT count(*) FROM outbox)").fetchone()
            self.samples.append({"contender": self.label, "t_s": round(time.monotonic() - t0, 1),
                                 "table_bytes": size, "rows": rows})
            time.sleep(1)
        self.conn.close()


def removal_statements(env):
    """The statements that removed outbox rows (and the polling relay's locking
    SELECT), from pg_stat_statements: calls, rows, execution ms, WAL bytes."""
    rows = env.q(
        "SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 120), calls, rows, "
        "round(total_exec_time::numeric, 1)::float8, wal_bytes::bigint, wal_records FROM pg_stat_statements "
        "WHERE (query ILIKE 'DELETE%outbox%' OR query ILIKE 'WITH gone AS (DELETE%' OR query ILIKE '%FOR UPDATE "
        "SKIP LOCKED%') ORDER BY total_exec_time DESC")
    return [{"query": q, "calls": c, "rows": r, "exec_ms": t, "wal_bytes": int(w), "wal_records": wr}
            for q, c, r, t, w, wr in rows]


def run(env, contender, rate, seconds, log, psycopg, walrelay_props, polling_cmd, free_port, proc_sched_s):
    """One contender at `rate` one-row transactions per second for `seconds`."""
    name = f"bench_ret_{contender}"
    prefix = name
    env.reset_outbox()
    env.q(AUTOVACUUM)
    env.create_topics(prefix)
    if contender == "walrelay":
        env.create_slot_and_publication(name)
        props = walrelay_props(env, name, prefix, {
            "admin.listen": f"127.0.0.1:{free_port()}",
            "table.include.list": "public.outbox",
            "table.retention.policy": "delete",
            "table.retention.ms": "10000",
            "table.retention.interval.ms": "1000",
            "table.retention.batch.size": "1000",
            "table.retention.time.column": "created_at",
        })
        cmd = [env.args.walrelay, "--config", props]
        app = "walrelay"
    else:
        cmd = polling_cmd(env, prefix)
        app = "bench-polling"
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                            stderr=open(os.path.join(env.args.work, f"{name}.log"), "w"))
    sampler = None
    log_path = os.path.join(env.args.work, f"{name}.log")
    try:
        if contender == "walrelay":
            # Until retention has given the table its floor (the slot's own,
            # or from its first run for a slot made without its view).
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None and not any(
                    m in open(log_path).read() for m in ("retention: rows of transactions from xid",
                                                         "retention: floors kept with slot")):
                time.sleep(0.1)
        # Warm: each topic's metadata.
        env.q("CALL bench_paced(4, 1)")
        deadline = time.monotonic() + 120
        while env.topic_count(prefix) < 4 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        time.sleep(2)
        env.q("SELECT pg_stat_statements_reset()")
        deleted0 = env.table_stats().get("n_tup_del", 0)
        backends = [pid for (pid,) in env.q(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND backend_type = 'client backend'",
            (app,), conn=env.mon)]
        cpu0 = sum(v for v in (proc_sched_s(p) for p in backends) if v is not None)
        wal0 = env.one("SELECT pg_current_wal_lsn()::text")
        sampler = Sampler(env, psycopg, contender)
        sampler.start()
        t0 = time.monotonic()
        env.q("CALL bench_paced(%s, %s)", (rate, seconds))
        offered = rate * seconds / (time.monotonic() - t0)
        total = 4 + rate * seconds
        deadline = time.monotonic() + 120
        while env.topic_count(prefix) < total and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
        time.sleep(15)  # a retention period and more: the last rows go too
        sampler.stop = True
        sampler.join()
        cpu1 = sum(v for v in (proc_sched_s(p) for p in backends) if v is not None)
        wal_total = int(env.one("SELECT pg_current_wal_lsn() - %s::pg_lsn", (wal0,)))
        statements = removal_statements(env)
        time.sleep(0.6)  # the statistics' flush interval
        deleted = env.table_stats().get("n_tup_del", 0) - deleted0
        in_kafka = env.topic_count(prefix)
        left = env.one("SELECT count(*) FROM outbox")
    finally:
        if sampler:
            sampler.stop = True
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    removal_wal = sum(s["wal_bytes"] for s in statements)
    removal_ms = sum(s["exec_ms"] for s in statements)
    samples = sampler.samples
    # After the first retention period plus a minute (autovacuum's first
    # pass): the size a steady load keeps the table at.
    steady = [s["table_bytes"] for s in samples if s["t_s"] >= 70] or [s["table_bytes"] for s in samples]
    res = {
        "contender": contender, "rate": rate, "seconds": seconds, "offered_events_per_s": round(offered),
        "events": total, "events_in_kafka": in_kafka, "rows_left": left, "rows_deleted": deleted,
        "removal_wal_bytes_per_row": round(removal_wal / deleted, 1) if deleted else None,
        "removal_exec_us_per_row": round(removal_ms * 1000 / deleted, 2) if deleted else None,
        "removal_backend_cpu_us_per_row": round((cpu1 - cpu0) * 1e6 / deleted, 2) if deleted else None,
        "wal_bytes_per_event_all": round(wal_total / (rate * seconds), 1),
        "table_bytes_max": max(s["table_bytes"] for s in samples),
        "table_bytes_steady_min": min(steady), "table_bytes_steady_max": max(steady),
        "table_rows_max": max(s["rows"] for s in samples),
        "statements": statements,
    }
    if contender == "walrelay":
        env.drop_slot(name)
    env.delete_topics(prefix)
    log(f"retention {contender}: {res['events_in_kafka']}/{res['events']} in Kafka, {deleted} rows deleted, "
        f"table {res['table_bytes_steady_min']}..{res['table_bytes_steady_max']} bytes after 70 s")
    return res, samples
