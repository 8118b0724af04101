#!/usr/bin/env python3
"""Where an idle walrelay's CPU goes, thread by thread; with --rate, where a
steady trickle of lone events' goes (one-row transactions at that rate
during the measurement: CPU µs and wake-ups per event, per thread).

Starts each given walrelay build on a fresh slot of the bench's PostgreSQL
and Kafka (bench/run.sh's services, or any: --pgport, --kafka), lets it
settle, then reads every thread's scheduler counters
(/proc/PID/task/TID/schedstat: nanoseconds on CPU, times scheduled) over
--seconds with no writes, and prints CPU ms/s and wake-ups/s per thread
name (librdkafka's rdk:main, rdk:broker<N>, ...; walrelay's own).

  bench/idle_threads.py --pgport P --kafka H:P --seconds 30 \\
      --build 'librdkafka 2.8.0=build-bench/walrelay' --build 'librdkafka 2.0.2=build-bench-rdkafka-2.0.2/walrelay' \\
      [--set kafka.statistics.interval.ms=10000] [--set exactly.once.support=required] [--json out.json]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

import psycopg

import provenance


def threads(pid):
    """{tid: (name, ns on CPU, times scheduled)} of a live process."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ns, _, slices = (int(x) for x in f.read().split())
            out[tid] = (name, ns, slices)
        except OSError:
            pass
    return out


def ready(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def measure(args, name, binary, n):
    slot = f"bench_idle_{n}"
    db = psycopg.connect(f"host=127.0.0.1 port={args.pgport} user=postgres dbname=postgres", autocommit=True)
    db.execute("CREATE TABLE IF NOT EXISTS bench_idle_outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), "
               "aggregatetype text, aggregateid text, type text, payload jsonb)")
    port = 18000 + n
    props = {"database.hostname": "127.0.0.1", "database.port": str(args.pgport), "database.user": "postgres",
             "database.dbname": "postgres", "slot.name": slot, "publication.name": slot,
             "table.include.list": "public.bench_idle_outbox", "kafka.bootstrap.servers": args.kafka,
             "admin.listen": f"127.0.0.1:{port}"}
    props.update(kv.split("=", 1) for kv in args.set)
    cfg = tempfile.NamedTemporaryFile("w", suffix=".properties", delete=False)
    cfg.write("".join(f"{k}={v}\n" for k, v in props.items()))
    cfg.close()
    proc = subprocess.Popen([binary, "--config", cfg.name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not ready(port) and time.monotonic() < deadline:
            time.sleep(0.2)
        # One event, then quiet: the state of a sidecar between events.
        db.execute("INSERT INTO bench_idle_outbox (aggregatetype, aggregateid, type, payload) "
                   "VALUES ('Idle', 'k', 'Created', '{}')")
        time.sleep(args.settle)
        before = threads(proc.pid)
        written = write_at(args.pgport, args.rate, args.seconds) if args.rate else time.sleep(args.seconds)
        after = threads(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        os.unlink(cfg.name)
        db.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                   (slot,))
        db.execute(f'DROP PUBLICATION IF EXISTS "{slot}"')
    by_name = {}
    for tid, (tname, ns, slices) in after.items():
        ns0, slices0 = before.get(tid, (tname, 0, 0))[1:]
        cpu, wakes = by_name.get(tname, (0.0, 0.0))
        by_name[tname] = (cpu + (ns - ns0) / 1e6 / args.seconds, wakes + (slices - slices0) / args.seconds)
    total = sum(c for c, _ in by_name.values())
    r = {"build": name, "binary": binary, "settings": args.set, "seconds": args.seconds,
         "cpu_ms_per_s": round(total, 3),
         "threads": {t: {"cpu_ms_per_s": round(c, 3), "wakeups_per_s": round(w, 1)}
                     for t, (c, w) in sorted(by_name.items(), key=lambda kv: -kv[1][0])}}
    if args.rate:
        per_s = written / args.seconds
        r.update(rate=args.rate, events=written, cpu_us_per_event=round(total * 1000 / per_s, 1))
        for t, v in r["threads"].items():
            v["cpu_us_per_event"] = round(v["cpu_ms_per_s"] * 1000 / per_s, 2)
            v["wakeups_per_event"] = round(v["wakeups_per_s"] / per_s, 2)
    return r


def write_at(pgport, rate, seconds):
    """One-row transactions at `rate` a second for `seconds`, paced by the
    clock (a late one is not made up twice); returns how many were written."""
    db = psycopg.connect(f"host=127.0.0.1 port={pgport} user=postgres dbname=postgres", autocommit=True)
    start, n = time.monotonic(), 0
    while True:
        due = start + n / rate
        now = time.monotonic()
        if due - start >= seconds:
            break
        if due > now:
            time.sleep(due - now)
        db.execute("INSERT INTO bench_idle_outbox (aggregatetype, aggregateid, type, payload) "
                   "VALUES ('Idle', %s, 'Created', '{}')", (str(n % 100),))
        n += 1
    db.close()
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pgport", required=True)
    ap.add_argument("--kafka", required=True)
    ap.add_argument("--build", action="append", required=True, metavar="NAME=BINARY")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--settle", type=float, default=15, help="quiet seconds before measuring")
    ap.add_argument("--rate", type=float, default=0, help="one-row transactions a second while measuring")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    # Where and with what it ran, as bench/bench.py's files record it
    # (bench/report.py prints it beside the table).
    started, host = provenance.now(), provenance.machine()
    results = []
    for n, b in enumerate(args.build):
        name, binary = b.split("=", 1)
        r = measure(args, name, binary, n)
        results.append(r)
        print(f"{name} ({' '.join(args.set) or 'defaults'}): {r['cpu_ms_per_s']} ms/s"
              + (f", {r['events']} events, {r['cpu_us_per_event']} µs/event" if args.rate else ""))
        for t, v in r["threads"].items():
            print(f"  {t:<20} {v['cpu_ms_per_s']:8.3f} ms/s {v['wakeups_per_s']:8.1f} wake-ups/s"
                  + (f" {v['cpu_us_per_event']:7.2f} µs/event {v['wakeups_per_event']:5.2f} wake-ups/event"
                     if args.rate else ""))
    if args.json:
        builds = {b.split("=", 1)[0]: provenance.build_info(b.split("=", 1)[1]) for b in args.build}
        with open(args.json, "w") as f:
            json.dump({"machine": host, "started": started, "finished": provenance.now(), "argv": sys.argv[1:],
                       "builds": builds, "runs": results}, f, indent=1)


if __name__ == "__main__":
    main()
