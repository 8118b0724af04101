"""The tableless outbox against the outbox table (bench.py --only tableless).

The writer's side: one-event transactions from a client, each event an
outbox row or a transactional logical message of the same content; WAL
bytes per event, commit latency, and what the table leaves behind (its
size, and the DELETE and VACUUM a clean-up job then runs). The relay's
side: walrelay relaying the same events from a table and from messages.
"""
import time

EMIT_SQL = """
CREATE OR REPLACE PROCEDURE bench_emit(n int, tx int) LANGUAGE plpgsql AS $$
DECLARE i int := 0;
BEGIN
  WHILE i < n LOOP
    PERFORM pg_logical_emit_message(true, 'outbox', jsonb_build_object(
        'id', gen_random_uuid(), 'aggregatetype', (ARRAY['Order','Customer','Invoice','Shipment'])[g % 4 + 1],
        'aggregateid', 'agg-' || (g % 10000), 'type', 'Created',
        'payload', jsonb_build_object('eventNo', g, 'aggregate', 'agg-' || (g % 10000), 'amount', g % 1000,
                                      'currency', 'EUR', 'pad', repeat('x', 120)))::text)
    FROM generate_series(i, least(i + tx, n) - 1) g;
    COMMIT;
    i := i + tx;
  END LOOP;
END $$;
"""

ROW_SQL = ("INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES (%s, %s, 'Created', "
           "jsonb_build_object('eventNo', %s::int, 'aggregate', %s::text, 'amount', %s::int, 'currency', 'EUR', "
           "'pad', repeat('x', 120)))")
MESSAGE_SQL = ("SELECT pg_logical_emit_message(true, 'outbox', jsonb_build_object('id', gen_random_uuid(), "
               "'aggregatetype', %s::text, 'aggregateid', %s::text, 'type', 'Created', 'payload', jsonb_build_object("
               "'eventNo', %s::int, 'aggregate', %s::text, 'amount', %s::int, 'currency', 'EUR', "
               "'pad', repeat('x', 120)))::text)")


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else None


def writer_side(env, kind, n, log, psycopg):
    """n one-event transactions from one client; a slot is held so that the
    WAL is the WAL a relay would read."""
    env.reset_outbox()
    env.q(EMIT_SQL)
    env.q("CREATE PUBLICATION bench_pub FOR TABLE public.outbox WITH (publish = 'insert')")
    env.create_slot("bench_writer")
    env.q("CHECKPOINT")
    conn = psycopg.connect(env.pg_dsn)
    sql = ROW_SQL if kind == "table" else MESSAGE_SQL
    lat = []
    lsn0 = env.one("SELECT pg_current_wal_insert_lsn() - '0/0'")
    for g in range(n):
        agg = f"agg-{g % 10000}"
        t0 = time.perf_counter()
        conn.execute(sql, (("Order", "Customer", "Invoice", "Shipment")[g % 4], agg, g, agg, g % 1000))
        conn.commit()
        lat.append(time.perf_counter() - t0)
    conn.close()
    lsn1 = env.one("SELECT pg_current_wal_insert_lsn() - '0/0'")
    r = {"section": "tableless", "side": "writer", "kind": kind, "events": n,
         "wal_bytes_per_event": round(float(lsn1 - lsn0) / n, 1),
         "commit_p50_ms": round(pct(lat, 50) * 1e3, 3), "commit_p99_ms": round(pct(lat, 99) * 1e3, 3)}
    if kind == "table":
        r["table_bytes_after"] = env.one("SELECT pg_total_relation_size('outbox')")
        # The clean-up job the table needs and the message does not.
        t0 = time.monotonic()
        l0 = env.one("SELECT pg_current_wal_insert_lsn() - '0/0'")
        env.q("DELETE FROM outbox")
        env.q("VACUUM outbox")
        r["cleanup_s"] = round(time.monotonic() - t0, 3)
        r["cleanup_wal_bytes_per_event"] = round(
            float(env.one("SELECT pg_current_wal_insert_lsn() - '0/0'") - l0) / n, 1)
    else:
        r["table_bytes_after"] = 0
        r["cleanup_s"] = 0
        r["cleanup_wal_bytes_per_event"] = 0
    env.drop_slot("bench_writer")
    log(f"tableless writer {kind}: {r}")
    return r


def relay_side(env, kind, n, tx, seq, run_walrelay, log):
    """walrelay relaying n events written as rows or as messages."""
    env.reset_outbox()
    env.q(EMIT_SQL)
    slot = f"bench_tl_{kind}_{seq}"
    env.q("CREATE PUBLICATION bench_pub FOR TABLE public.outbox WITH (publish = 'insert')")
    env.create_slot(slot)
    env.create_topics(slot)
    t0 = time.monotonic()
    if kind == "table":
        end_lsn = env.fill(n, tx)
        extra = {}
    else:
        env.q("CALL bench_emit(%s, %s)", (n, tx))
        end_lsn = env.one("SELECT pg_current_wal_insert_lsn()::text")
        log(f"emitted {n} messages in {tx}-message transactions in {time.monotonic() - t0:.1f} s")
        extra = {"message.prefix.include.list": "outbox"}
    r = run_walrelay(env, n, slot, end_lsn, extra)
    r.update(section="tableless", side="relay", kind=kind)
    return r
