#!/usr/bin/env python3
"""The fault campaign (issue #38): every outbox shape, faults at random
moments, one checker of the whole history, for one sink and mode.

  campaign.py --sink kafka|kafka-eos|nats|rabbitmq [--seed N] [--duration S] [--no-faults]

Runs on the `campaign` services group's servers (WALRELAY_SERVICES_GROUP,
default `campaign`; start them with `scripts/services.sh start`, and `start
nats` / `start rabbitmq` for those sinks). It starts its own walrelay
(build/walrelay, --walrelay overrides) under a supervisor loop that restarts
it whenever it exits, as systemd's Restart=always would.

Three parts, all drawn from one seed (printed first, so a run is repeated
with --seed):
- writers commit transactions of every shape (`SHAPES`) through psql; an
  event is committed only when psql saw COMMIT return (exit 0); a failed
  psql whose script ended in COMMIT is "maybe";
- the nemesis injects faults (`FAULTS`) at random moments until the
  duration is up;
- then everything heals, the writers stop, the slot catches up, and the
  checker reads the broker with independent clients (confluent-kafka,
  tests/integration/nats/read.py, tests/integration/rabbitmq/read.py) and
  checks the history (`check`).

Exit 0 when every check holds; 1 with the seed, the fault schedule and the
first wrong event; the history (history.jsonl) and walrelay's logs are
kept in the work directory either way.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = sys.executable
# An oversized row's payload, and the limit the sink enforces below it (the
# producer's kafka.message.max.bytes, the NATS stream's max_msg_size).
OVERSIZE = 150_000
SIZE_LIMIT = 100_000
# walrelay's RSS bound: its in-flight records are bounded by max.inflight.*
# (2048 records; the largest event here is the oversized row, 150 kB), and the
# decoder spills big transactions to disk past logical_decoding_work_mem on the
# server; so its RSS should stay near its idle size (~20-40 MiB with
# librdkafka's buffers). 256 MiB leaves room for librdkafka's queues and
# allocator slack, and still catches a transaction or a replay held in memory.
RSS_LIMIT_KIB = 256 * 1024


def log(*a):
    print(f"[campaign {time.strftime('%H:%M:%S')}]", *a, flush=True)


def services_env(group):
    env = dict(os.environ, WALRELAY_SERVICES_GROUP=group)
    out = subprocess.run([f"{ROOT}/scripts/services.sh", "env"], env=env, check=True,
                         capture_output=True, text=True).stdout
    facts = {}
    for line in out.splitlines():
        m = re.match(r"export (\w+)='?(.*?)'?$", line)
        if m:
            facts[m.group(1)] = m.group(2)
    return facts


class Pg:
    def __init__(self, s):
        self.args = ["psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-h", s["WALRELAY_TEST_PGHOST"],
                     "-p", s["WALRELAY_TEST_PGPORT"], "-U", s["WALRELAY_TEST_PGUSER"], "-d",
                     s["WALRELAY_TEST_PGDATABASE"]]

    def run(self, sql, timeout=60):
        """(exit status, output) of one psql session."""
        try:
            r = subprocess.run(self.args, input=sql, capture_output=True, text=True, timeout=timeout,
                               env=dict(os.environ, PGCONNECT_TIMEOUT="5"))
            return r.returncode, r.stdout + r.stderr
        except subprocess.TimeoutExpired:
            return 99, "psql timed out"

    def must(self, sql):
        code, out = self.run(sql)
        if code != 0:
            raise RuntimeError(f"psql failed: {out}\n{sql[:500]}")
        return out.strip()

    def eventually(self, sql, timeout=120):
        deadline = time.monotonic() + timeout
        while True:
            code, out = self.run(sql)
            if code == 0:
                return out.strip()
            if time.monotonic() > deadline:
                raise RuntimeError(f"psql kept failing: {out}")
            time.sleep(1)


class History:
    """Every event's fate, appended as JSON lines (history.jsonl) as it is
    decided: committed, maybe, rolled_back, and which were oversized."""

    def __init__(self, path):
        self.f = open(path, "w")
        self.lock = threading.Lock()
        self.events = {}  # id -> {"fate", "key", "oversized", "tx"}
        self.tx_counts = {}

    def record(self, tx, shape, fate, events):
        with self.lock:
            self.tx_counts[(shape, fate)] = self.tx_counts.get((shape, fate), 0) + 1
            for e in events:
                e = dict(e, tx=tx, shape=shape)
                if e["fate"] is None:
                    e["fate"] = fate
                self.events[e["id"]] = e
                self.f.write(json.dumps(e) + "\n")
            self.f.write(json.dumps({"tx": tx, "shape": shape, "fate": fate, "n": len(events)}) + "\n")
            self.f.flush()

    def note(self, obj):
        with self.lock:
            self.f.write(json.dumps(obj) + "\n")
            self.f.flush()


class Campaign:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        # The seed decides the run; the time in the name lets a seed be run
        # again beside a failed run's leftovers (kept for the post-mortem).
        self.name = f"camp_{args.sink.replace('-', '_')}_{args.seed % 10**9}_{int(time.time()) % 100000}"
        self.dir = args.workdir or f"/tmp/walrelay-campaign-{self.name}"
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        if args.sink in ("nats", "rabbitmq"):
            # On demand, as the sink tests start theirs (`stop` stops them).
            subprocess.run([f"{ROOT}/scripts/services.sh", "start", args.sink], check=True, capture_output=True,
                           env=dict(os.environ, WALRELAY_SERVICES_GROUP=args.group))
        self.s = services_env(args.group)
        self.run_dir = self.s["WALRELAY_RUN_DIR"]
        self.pg = Pg(self.s)
        self.history = History(f"{self.dir}/history.jsonl")
        self.topic = f"{self.name}.events"
        self.dead = f"{self.name}_dead"
        self.keys = [f"k{i}" for i in range(6)]
        self.stop_writers = threading.Event()
        self.stop_faults = threading.Event()
        self.stop_all = threading.Event()
        self.schedule = []  # (time since start, fault, detail)
        self.start_time = time.monotonic()
        self.proc = None
        self.proc_lock = threading.Lock()
        self.restarts = []
        self.rss = []
        self.tx_seq = 0
        self.tx_lock = threading.Lock()
        self.oversized_ok = args.sink != "rabbitmq"

    # ---- set-up -------------------------------------------------------------
    def setup(self):
        n = self.name
        cols = "aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload text"
        self.pg.must(f"""
ALTER SYSTEM SET logical_decoding_work_mem = '64kB';
SELECT pg_reload_conf();
CREATE TABLE {n}_keyseq (k text PRIMARY KEY, seq bigint NOT NULL);
INSERT INTO {n}_keyseq SELECT 'k' || i, 0 FROM generate_series(0, {len(self.keys) - 1}) i;
CREATE TABLE {n}_a (id text PRIMARY KEY, {cols});
CREATE TABLE {n}_b (id text PRIMARY KEY, {cols});
CREATE TABLE {n}_p (id text, {cols}, PRIMARY KEY (id)) PARTITION BY HASH (id);
CREATE TABLE {n}_p0 PARTITION OF {n}_p FOR VALUES WITH (MODULUS 2, REMAINDER 0);
CREATE TABLE {n}_p1 PARTITION OF {n}_p FOR VALUES WITH (MODULUS 2, REMAINDER 1);
""")
        s = self.s
        cfg = [f"database.hostname={s['WALRELAY_TEST_PGHOST']}", f"database.port={s['WALRELAY_TEST_PGPORT']}",
               f"database.user={s['WALRELAY_TEST_PGUSER']}", f"database.dbname={s['WALRELAY_TEST_PGDATABASE']}",
               f"slot.name={n}", f"publication.name={n}", "admin.listen=127.0.0.1:0", "log.level=info",
               "slot.status.interval.ms=1000", "reconnect.backoff.max.ms=2000",
               f"table.include.list=public.{n}_a,public.{n}_b,public.{n}_p",
               f"message.prefix.include.list={n}", f"route.topic.replacement={self.topic}",
               "errors.tolerance=all", f"errors.deadletterqueue.topic.name={self.dead}"]
        sink = self.args.sink
        if sink.startswith("kafka"):
            cfg += [f"kafka.bootstrap.servers={s['WALRELAY_TEST_KAFKA']}", f"kafka.message.max.bytes={SIZE_LIMIT}"]
            if sink == "kafka-eos":
                cfg += ["exactly.once.support=required", "kafka.transaction.timeout.ms=30000",
                        "transaction.boundary.interval.ms=100"]
            self.create_kafka_topics()
        elif sink == "nats":
            url = s["WALRELAY_TEST_NATS"]
            cfg += ["sink.type=nats-jetstream", f"sink.nats-jetstream.url={url}",
                    "sink.nats-jetstream.ack.timeout.ms=3000"]
            self.nats("stream-add", "--name", f"{n}_main", "--subjects", self.topic, "--max-msg-size",
                      str(SIZE_LIMIT), "--duplicate-window", "600")
            self.nats("stream-add", "--name", f"{n}_dlq", "--subjects", self.dead, "--duplicate-window", "600")
        elif sink == "rabbitmq":
            host, port = s["WALRELAY_TEST_RABBITMQ"].rsplit(":", 1)
            cfg += ["sink.type=rabbitmq", f"sink.rabbitmq.connection.host={host}",
                    f"sink.rabbitmq.connection.port={port}", f"sink.rabbitmq.exchange={n}_x",
                    "sink.rabbitmq.ackTimeout=5000", "sink.rabbitmq.connection.requested.heartbeat=2"]
            self.rabbit("declare", "--exchange", f"{n}_x", "--queue", f"{n}_q", "--binding", self.topic)
            self.rabbit("declare", "--exchange", f"{n}_x", "--queue", f"{n}_dlq", "--binding", self.dead)
        with open(f"{self.dir}/walrelay.properties", "w") as f:
            f.write("\n".join(cfg) + "\n")

    def create_kafka_topics(self):
        from confluent_kafka.admin import AdminClient, NewTopic
        admin = AdminClient({"bootstrap.servers": self.s["WALRELAY_TEST_KAFKA"]})
        futures = admin.create_topics([NewTopic(self.topic, 3, 1), NewTopic(self.dead, 1, 1)])
        for f in futures.values():
            f.result(30)

    def nats(self, *a, check=True):
        r = subprocess.run([PY, f"{ROOT}/tests/integration/nats/read.py", "--url", self.s["WALRELAY_TEST_NATS"],
                            *a], capture_output=True, text=True, timeout=600)
        if check and r.returncode != 0:
            raise RuntimeError(f"nats read.py {a}: {r.stderr}")
        return r.stdout

    def rabbit(self, *a, check=True):
        r = subprocess.run([PY, f"{ROOT}/tests/integration/rabbitmq/read.py", "--url",
                            self.s["WALRELAY_TEST_RABBITMQ"], *a], capture_output=True, text=True, timeout=600)
        if check and r.returncode != 0:
            raise RuntimeError(f"rabbitmq read.py {a}: {r.stderr}")
        return r.stdout

    # ---- walrelay under a supervisor ---------------------------------------------
    def spawn(self):
        logf = open(f"{self.dir}/walrelay.log", "a")
        logf.write(f"==== start at {time.monotonic() - self.start_time:.1f}s\n")
        logf.flush()
        self.proc = subprocess.Popen([self.args.walrelay, "--config", f"{self.dir}/walrelay.properties"],
                                     stdout=logf, stderr=subprocess.STDOUT)

    def supervisor(self):
        while not self.stop_all.is_set():
            with self.proc_lock:
                code = self.proc.poll()
                if code is not None:
                    self.restarts.append((round(time.monotonic() - self.start_time, 1), code))
                    log(f"walrelay exited {code}; restarting")
                    time.sleep(0.5)
                    self.spawn()
                else:
                    self.sample_rss(self.proc.pid)
            time.sleep(0.5)

    def sample_rss(self, pid):
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        self.rss.append(int(line.split()[1]))
        except OSError:
            pass

    # ---- the workload ------------------------------------------------------
    def next_tx(self):
        with self.tx_lock:
            self.tx_seq += 1
            return self.tx_seq

    def insert(self, rng, tx, key, table=None, n=1, pad=0, idx=0, oversized=False):
        """SQL inserting n events of `key` into a table, each with its key's
        next sequence number (the key's row lock orders them by commit), and
        the events it makes."""
        table = table or rng.choice(["a", "b", "p"])
        ids = [f"t{tx}_{idx + i}" for i in range(n)]
        size = OVERSIZE if oversized else pad
        sql = (f"WITH s AS (UPDATE {self.name}_keyseq SET seq = seq + {n} WHERE k = '{key}' RETURNING seq) "
               f"INSERT INTO {self.name}_{table} (id, aggregatetype, aggregateid, type, payload) "
               f"SELECT 't{tx}_' || ({idx} + g - 1), 'campaign', '{key}', 'row', "
               f"json_build_object('id', 't{tx}_' || ({idx} + g - 1), 'key', '{key}', 'seq', s.seq - {n} + g, "
               f"'pad', repeat('x', {size}))::text FROM s, generate_series(1, {n}) g;\n")
        return sql, [{"id": i, "key": key, "oversized": oversized, "fate": None} for i in ids]

    def message(self, tx, key, idx=0):
        i = f"t{tx}_{idx}"
        sql = (f"WITH s AS (UPDATE {self.name}_keyseq SET seq = seq + 1 WHERE k = '{key}' RETURNING seq) "
               f"SELECT pg_logical_emit_message(true, '{self.name}', json_build_object('id', '{i}', "
               f"'aggregatetype', 'campaign', 'aggregateid', '{key}', 'type', 'message', 'payload', "
               f"json_build_object('id', '{i}', 'key', '{key}', 'seq', s.seq))::text) FROM s;\n")
        return sql, [{"id": i, "key": key, "oversized": False, "fate": None}]

    SHAPES = ["one", "many", "insert_delete", "message", "rollback", "savepoint", "two_tables", "partitioned",
              "spill", "oversized"]
    WEIGHTS = [20, 12, 8, 8, 6, 8, 8, 8, 2, 1]

    def transaction(self, rng):
        tx = self.next_tx()
        key = rng.choice(self.keys)
        shape = rng.choices(self.SHAPES, self.WEIGHTS)[0]
        if shape == "oversized" and not self.oversized_ok:
            shape = "one"
        body, events, end = "", [], "COMMIT;\n"
        if shape == "one":
            body, events = self.insert(rng, tx, key)
        elif shape == "many":
            body, events = self.insert(rng, tx, key, n=rng.randint(1, 500), pad=rng.randint(0, 200))
        elif shape == "insert_delete":
            t = rng.choice(["a", "b", "p"])
            body, events = self.insert(rng, tx, key, table=t, n=rng.randint(1, 5))
            body += f"DELETE FROM {self.name}_{t} WHERE id LIKE 't{tx}\\_%';\n"
        elif shape == "message":
            b1, e1 = self.message(tx, key)
            b2, e2 = self.insert(rng, tx, key, idx=1)
            body, events = b1 + b2, e1 + e2
        elif shape == "rollback":
            body, events = self.insert(rng, tx, key, n=rng.randint(1, 20))
            end = "ROLLBACK;\n"
        elif shape == "savepoint":
            b1, e1 = self.insert(rng, tx, key, n=2, idx=0)
            b2, e2 = self.insert(rng, tx, key, n=2, idx=2)
            b3, e3 = self.insert(rng, tx, key, n=1, idx=4)
            for e in e2:
                e["fate"] = "rolled_back"
            body = b1 + "SAVEPOINT sp;\n" + b2 + "ROLLBACK TO SAVEPOINT sp;\n" + b3
            events = e1 + e2 + e3
        elif shape == "two_tables":
            b1, e1 = self.insert(rng, tx, key, table="a", n=rng.randint(1, 3), idx=0)
            b2, e2 = self.insert(rng, tx, key, table="b", n=rng.randint(1, 3), idx=10)
            body, events = b1 + b2, e1 + e2
        elif shape == "partitioned":
            body, events = self.insert(rng, tx, key, table="p", n=rng.randint(1, 20))
        elif shape == "spill":
            body, events = self.insert(rng, tx, key, n=rng.randint(800, 1500), pad=300)
        elif shape == "oversized":
            b1, e1 = self.insert(rng, tx, key, idx=0)
            b2, e2 = self.insert(rng, tx, key, idx=1, oversized=True)
            b3, e3 = self.insert(rng, tx, key, idx=2)
            body, events = b1 + b2 + b3, e1 + e2 + e3
        code, out = self.pg.run("BEGIN;\n" + body + end)
        if end.startswith("ROLLBACK"):
            fate = "rolled_back"
        elif code == 0:
            fate = "committed"
        else:
            # COMMIT may or may not have happened: psql failed somewhere in
            # the script, possibly after the server committed.
            fate = "maybe"
            self.history.note({"tx": tx, "psql_error": out[-300:]})
        for e in events:
            if fate == "rolled_back":
                e["fate"] = "rolled_back"
            elif fate == "maybe" and e["fate"] is None:
                e["fate"] = "maybe"
        self.history.record(tx, shape, fate, events)
        return fate

    def writer(self, wid):
        rng = random.Random(self.args.seed * 1000 + wid)
        while not self.stop_writers.is_set():
            fate = self.transaction(rng)
            time.sleep(rng.uniform(0.02, 0.15) if fate != "maybe" else 0.5)

    # ---- the nemesis -------------------------------------------------------
    FAULTS = ["kill9", "sigstop", "broker_restart", "broker_freeze", "pg_restart", "walsender_terminate"]

    def services(self, *a):
        env = dict(os.environ, WALRELAY_SERVICES_GROUP=self.args.group)
        r = subprocess.run([f"{ROOT}/scripts/services.sh", *a], env=env, capture_output=True, text=True)
        if r.returncode != 0:
            log(f"services.sh {' '.join(a)} failed: {r.stdout[-500:]}{r.stderr[-500:]}")

    def broker(self):
        return {"kafka": "kafka", "kafka-eos": "kafka", "nats": "nats", "rabbitmq": "rabbitmq"}[self.args.sink]

    def broker_pid(self):
        with open(f"{self.run_dir}/{self.broker()}/pid") as f:
            return int(f.read().strip())

    def fault(self, rng, kind):
        t = round(time.monotonic() - self.start_time, 1)
        hold = round(rng.uniform(1, 6), 1)
        self.schedule.append((t, kind, hold))
        self.history.note({"fault": kind, "at": t, "hold": hold})
        log(f"fault at {t}s: {kind} ({hold}s)")
        if kind == "kill9":
            with self.proc_lock:
                self.proc.send_signal(signal.SIGKILL)
        elif kind == "sigstop":
            with self.proc_lock:
                p = self.proc
            p.send_signal(signal.SIGSTOP)
            time.sleep(hold)
            p.send_signal(signal.SIGCONT)
        elif kind == "broker_restart":
            b = self.broker()
            self.services(f"{b}-stop")
            time.sleep(hold)
            self.services(f"{b}-start")
        elif kind == "broker_freeze":
            pid = self.broker_pid()
            os.kill(pid, signal.SIGSTOP)
            time.sleep(hold)
            os.kill(pid, signal.SIGCONT)
        elif kind == "pg_restart":
            self.services("pg-restart", "immediate")
        elif kind == "walsender_terminate":
            self.pg.run(f"SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                        f"WHERE slot_name = '{self.name}' AND active_pid IS NOT NULL;")

    def nemesis(self):
        rng = random.Random(self.args.seed * 7 + 1)
        while not self.stop_faults.wait(rng.uniform(2, 7)):
            self.fault(rng, rng.choice(self.FAULTS))

    # ---- healing and reading -----------------------------------------------------
    def admin_port(self):
        with open(f"{self.dir}/walrelay.log") as f:
            ports = re.findall(r"admin.*?127\.0\.0\.1:(\d+)", f.read())
        return ports[-1] if ports else None

    def catch_up(self, timeout=240):
        """Wait until the slot is confirmed past the last write (every record
        walrelay produced is acknowledged by then)."""
        target = self.pg.eventually("SELECT pg_current_wal_lsn();")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code, out = self.pg.run(f"SELECT confirmed_flush_lsn >= '{target}' FROM pg_replication_slots "
                                    f"WHERE slot_name = '{self.name}';")
            if code == 0 and out.strip() == "t":
                return True
            time.sleep(1)
        return False

    def read_kafka(self, topic, isolation):
        from confluent_kafka import Consumer, TopicPartition
        c = Consumer({"bootstrap.servers": self.s["WALRELAY_TEST_KAFKA"], "group.id": f"{self.name}-{isolation}",
                      "isolation.level": isolation, "enable.auto.commit": False, "auto.offset.reset": "earliest"})
        md = c.list_topics(topic, timeout=30).topics[topic]
        parts = [TopicPartition(topic, p, 0) for p in md.partitions]
        c.assign(parts)
        out, idle = [], time.monotonic()
        while time.monotonic() - idle < 8:
            m = c.poll(0.5)
            if m is None or m.error():
                continue
            idle = time.monotonic()
            hdrs = {k: (v.decode() if v is not None else None) for k, v in (m.headers() or [])}
            out.append({"partition": m.partition(), "offset": m.offset(), "data": (m.value() or b"").decode(),
                        "headers": hdrs})
        c.close()
        return out

    def read(self):
        """{stream name: records} from independent clients."""
        sink, n = self.args.sink, self.name
        if sink.startswith("kafka"):
            got = {"read_uncommitted": self.read_kafka(self.topic, "read_uncommitted"),
                   "dead": self.read_kafka(self.dead, "read_uncommitted")}
            if sink == "kafka-eos":
                got["read_committed"] = self.read_kafka(self.topic, "read_committed")
            return got
        if sink == "nats":
            parse = lambda s: [json.loads(line) for line in s.splitlines() if line.strip()]
            return {"main": parse(self.nats("read", "--name", f"{n}_main")),
                    "dead": parse(self.nats("read", "--name", f"{n}_dlq"))}
        parse = lambda s: [json.loads(line) for line in s.splitlines() if line.strip()]
        return {"main": parse(self.rabbit("read", "--queue", f"{n}_q")),
                "dead": parse(self.rabbit("read", "--queue", f"{n}_dlq"))}

    # ---- the checker -------------------------------------------------------
    def check(self, got):
        """A list of problems, first the first wrong event of each kind."""
        problems = []
        ev = self.history.events
        sink = self.args.sink
        for stream, records in got.items():
            if stream == "dead":
                ids = [r["headers"].get("id") or r.get("message_id") or r["headers"].get("Nats-Msg-Id")
                       for r in records]
                want = {i for i, e in ev.items() if e["oversized"] and e["fate"] == "committed"}
                maybe = {i for i, e in ev.items() if e["oversized"] and e["fate"] == "maybe"}
                extra = [i for i in ids if i not in want and i not in maybe]
                missing = sorted(want - set(ids))
                if extra:
                    problems.append(f"dead: {len(extra)} dead-lettered that were not committed oversized rows, "
                                    f"first {extra[0]} ({ev.get(extra[0])})")
                if missing:
                    problems.append(f"dead: {len(missing)} committed oversized rows not dead-lettered, first "
                                    f"{missing[0]}")
                continue
            exactly_once = stream == "read_committed" or (sink == "nats")
            seen, last_seq, order_breaks = {}, {}, []
            for r in records:
                try:
                    p = json.loads(r["data"])
                except ValueError:
                    problems.append(f"{stream}: a record that is not an event: {r['data'][:200]}")
                    continue
                i = p["id"]
                seen[i] = seen.get(i, 0) + 1
                if seen[i] > 1:
                    continue
                e = ev.get(i)
                if e is None or e["fate"] == "rolled_back":
                    problems.append(f"{stream}: event {i} arrived but was rolled back or never written "
                                    f"({e})")
                    continue
                if e["oversized"]:
                    problems.append(f"{stream}: oversized event {i} arrived in the main stream")
                # Per key, first copies in commit order: the key's sequence
                # numbers only grow (a partition keeps a key's order; the
                # checker reads each partition in order, and a key has one).
                k = p["key"]
                if p["seq"] <= last_seq.get(k, 0):
                    order_breaks.append(f"key {k}: seq {p['seq']} ({i}) after {last_seq[k]}")
                last_seq[k] = max(last_seq.get(k, 0), p["seq"])
            missing = sorted((i for i, e in ev.items() if e["fate"] == "committed" and not e["oversized"]
                              and i not in seen), key=lambda i: (int(i[1:].split("_")[0]), int(i.split("_")[1])))
            if missing:
                problems.append(f"{stream}: {len(missing)} committed events missing, first {missing[0]} "
                                f"({ev[missing[0]]})")
            if order_breaks:
                problems.append(f"{stream}: {len(order_breaks)} per-key order breaks, first {order_breaks[0]}")
            dups = [i for i, c in seen.items() if c > 1]
            if exactly_once and dups:
                problems.append(f"{stream}: {len(dups)} events more than once, first {dups[0]} ({seen[dups[0]]}x)")
            self.stats[stream] = {"records": len(records), "distinct": len(seen), "duplicates": len(dups),
                                  "order_breaks": len(order_breaks), "missing": len(missing)}
        peak = max(self.rss, default=0)
        if peak > RSS_LIMIT_KIB:
            problems.append(f"walrelay's RSS reached {peak} KiB, over {RSS_LIMIT_KIB} KiB")
        return problems

    # ---- the run -------------------------------------------------------------
    def run(self):
        args = self.args
        log(f"seed {args.seed} sink {args.sink} duration {args.duration}s dir {self.dir}")
        log(f"repeat: {sys.executable} {os.path.abspath(__file__)} --sink {args.sink} --seed {args.seed} "
            f"--duration {args.duration}")
        self.setup()
        self.stats = {}
        self.spawn()
        sup = threading.Thread(target=self.supervisor, daemon=True)
        sup.start()
        # Rows committed before the slot's consistent point are not relayed
        # (snapshot.mode=no_data): the writers start once the slot exists.
        deadline = time.monotonic() + 60
        while self.pg.run(f"SELECT 1 FROM pg_replication_slots WHERE slot_name = '{self.name}';")[1].strip() != "1":
            if time.monotonic() > deadline:
                raise RuntimeError("walrelay did not create its slot within 60 s")
            time.sleep(0.2)
        writers = [threading.Thread(target=self.writer, args=(w,), daemon=True) for w in range(2)]
        for w in writers:
            w.start()
        nem = None
        if not args.no_faults:
            nem = threading.Thread(target=self.nemesis, daemon=True)
            nem.start()
        time.sleep(args.duration)
        self.stop_faults.set()
        if nem:
            nem.join()
        # Heal: every server up and running (a stopped broker started again,
        # a frozen one thawed by its fault's own end), then a quiet tail.
        self.services("start", *([self.broker()] if self.broker() != "kafka" else []))
        time.sleep(3)
        self.stop_writers.set()
        for w in writers:
            w.join()
        caught = self.catch_up()
        self.stop_all.set()
        sup.join()
        with self.proc_lock:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        got = self.read()
        problems = [] if caught else ["the slot did not catch up with the last write within 240 s"]
        # The premise: a leg that injected no fault, or wrote no event of a
        # committed shape, would pass without testing what it is for.
        if not args.no_faults and not self.schedule:
            problems.append("no fault was injected")
        shapes = {sh for (sh, fate) in self.history.tx_counts if fate == "committed"}
        # (The rare shapes, spill and oversized, may miss a short leg: the
        # summary counts them.)
        absent = [sh for sh in self.SHAPES if sh not in shapes and sh not in ("rollback", "spill", "oversized")]
        if absent and args.duration >= 30:
            problems.append(f"shapes never committed: {absent}")
        problems += self.check(got)
        counts = {}
        for e in self.history.events.values():
            counts[e["fate"]] = counts.get(e["fate"], 0) + 1
        kinds = {}
        for _, k, _ in self.schedule:
            kinds[k] = kinds.get(k, 0) + 1
        summary = {"seed": args.seed, "sink": args.sink, "events": counts, "faults": kinds,
                   "transactions": {f"{sh}/{fate}": c for (sh, fate), c in sorted(self.history.tx_counts.items())},
                   "walrelay_exits": self.restarts, "peak_rss_kib": max(self.rss, default=0),
                   "streams": self.stats, "dead_lettered": len(got.get("dead", []))}
        self.history.note({"summary": summary})
        log("summary " + json.dumps(summary))
        if problems:
            log(f"FAILED seed {args.seed} sink {args.sink}; history kept in {self.dir}")
            log("fault schedule (s since start, kind, hold s): " + json.dumps(self.schedule))
            for p in problems:
                log("problem: " + p)
            return 1
        self.cleanup()
        log(f"passed seed {args.seed} sink {args.sink}")
        return 0

    def cleanup(self):
        """Drop what the run made on the shared servers (its history stays)."""
        n = self.name
        self.pg.run(f"SELECT pg_drop_replication_slot('{n}') FROM pg_replication_slots WHERE slot_name = '{n}';"
                    f"DROP PUBLICATION IF EXISTS {n}; DROP TABLE IF EXISTS {n}_a, {n}_b, {n}_p, {n}_keyseq;")
        if self.args.sink == "nats":
            self.nats("stream-delete", "--name", f"{n}_main", check=False)
            self.nats("stream-delete", "--name", f"{n}_dlq", check=False)
        elif self.args.sink == "rabbitmq":
            self.rabbit("delete", "--exchange", f"{n}_x", "--queue", f"{n}_q", check=False)
            self.rabbit("delete", "--exchange", f"{n}_x", "--queue", f"{n}_dlq", check=False)
        elif self.args.sink.startswith("kafka"):
            from confluent_kafka.admin import AdminClient
            AdminClient({"bootstrap.servers": self.s["WALRELAY_TEST_KAFKA"]}).delete_topics([self.topic, self.dead])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sink", required=True, choices=["kafka", "kafka-eos", "nats", "rabbitmq"])
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--duration", type=float, default=60)
    p.add_argument("--no-faults", action="store_true")
    p.add_argument("--group", default=os.environ.get("WALRELAY_SERVICES_GROUP", "campaign"))
    p.add_argument("--walrelay", default=f"{ROOT}/build/walrelay")
    p.add_argument("--workdir", default=None)
    args = p.parse_args()
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 2**31)
    print(f"campaign seed: {args.seed}", flush=True)
    c = Campaign(args)
    try:
        return c.run()
    finally:
        c.stop_all.set()
        if c.proc and c.proc.poll() is None:
            c.proc.kill()


if __name__ == "__main__":
    sys.exit(main())
