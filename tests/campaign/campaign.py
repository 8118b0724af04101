#!/usr/bin/env python3
"""The fault campaign (issue #38): every outbox shape, faults at random
moments, one checker of the whole history, for one sink and mode.

  campaign.py --sink kafka|kafka-eos|nats|rabbitmq|redis|http|sqs [--seed N] [--duration S] [--no-faults]

Runs on the `campaign` services group's servers (WALRELAY_SERVICES_GROUP,
default `campaign`; start them with `scripts/services.sh start`, and `start
nats` / `start rabbitmq` / `start redis` for those sinks). It starts two walrelays of its
own on one slot (build/walrelay, --walrelay overrides), an active one and a
standby, each under a supervisor loop that restarts it whenever it exits,
as systemd's Restart=always would. They reach PostgreSQL and the broker
through Toxiproxy (scripts/toxiproxy.sh), the writers and the checker
directly.

Three parts, all drawn from one seed (printed first, so a run is repeated
with --seed):
- rows already in the outbox (--snapshot-rows) go out in the initial
  snapshot, under the first faults; then writers commit transactions of
  every shape (`SHAPES`) through psql; an event is committed only when psql
  saw COMMIT return (exit 0); a failed psql whose script ended in COMMIT is
  "maybe";
- the nemesis injects faults (`FAULTS`) at random moments until the
  duration is up: kill -9 of either walrelay, the active one frozen until
  the standby takes over, the broker stopped, killed or frozen, PostgreSQL
  restarted, the walsender terminated, and on either network path latency,
  a stall, resets or an outage;
- then everything heals, the writers stop, the slot catches up, and the
  checker reads the broker with independent clients (confluent-kafka,
  tests/integration/nats/read.py, tests/integration/rabbitmq/read.py,
  tests/integration/redis/read.py) and
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
import resource
import shutil
import select
import signal
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))
PY = sys.executable
# An oversized row's payload, and the limit the sink enforces below it (the
# producer's kafka.message.max.bytes, the NATS stream's max_msg_size).
OVERSIZE = 150_000
SQS_OVERSIZE = 300_000
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


def free_port():
    """A port free now, below the ephemeral range, and named by no run
    directory's port file: scripts/lib.sh's free_port (a stopped server of
    another group keeps its port)."""
    r = subprocess.run(["bash", "-c", f'source "{ROOT}/scripts/lib.sh" && free_port'], capture_output=True,
                       text=True)
    if r.returncode != 0 or not r.stdout.strip().isdigit():
        raise RuntimeError(f"free_port: {r.stderr.strip() or r.stdout.strip()}")
    return int(r.stdout.strip())


class Toxiproxy:
    """Toxiproxy's server (built by scripts/toxiproxy.sh) and its REST API:
    walrelay reaches PostgreSQL and the broker only through its proxies, on
    which the nemesis puts latency, stalls, resets and outages. The writers
    and the checker connect directly."""

    def __init__(self, workdir, seed):
        binary = subprocess.run([f"{ROOT}/scripts/toxiproxy.sh"], check=True, capture_output=True,
                                text=True).stdout.strip()
        self.port = free_port()
        self.log = open(f"{workdir}/toxiproxy.log", "w")
        self.proc = subprocess.Popen([binary, "-host", "127.0.0.1", "-port", str(self.port), "-seed", str(seed)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.api("GET", "/version", parse=False)
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"toxiproxy did not answer on {self.port}; see {workdir}/toxiproxy.log")
                time.sleep(0.1)

    def api(self, method, path, body=None, parse=True):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        # (Generous: removing a latency toxic waits for the data it holds,
        # and a loaded machine answers slowly.)
        with urllib.request.urlopen(req, timeout=60) as r:
            text = r.read()
        return json.loads(text) if parse and text.strip() else None

    def proxy(self, name, listen, upstream):
        """A proxy from listen (host:port, port 0 for any) to upstream; the
        port it listens on."""
        made = self.api("POST", "/proxies", {"name": name, "listen": listen, "upstream": upstream,
                                            "enabled": True})
        return int(made["listen"].rsplit(":", 1)[1])

    def toxic(self, proxy, name, kind, attributes, stream):
        self.api("POST", f"/proxies/{proxy}/toxics", {"name": name, "type": kind, "stream": stream,
                                                     "toxicity": 1.0, "attributes": attributes})

    def untoxic(self, proxy, name):
        self.api("DELETE", f"/proxies/{proxy}/toxics/{name}")

    def enabled(self, proxy, on):
        self.api("POST", f"/proxies/{proxy}", {"enabled": on})

    def heal(self):
        """Every proxy enabled, every toxic removed."""
        self.api("POST", "/reset")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class Instance:
    """One walrelay under a supervisor loop; two run on the slot, the one
    that holds it active, the other a standby that takes over when it goes."""

    def __init__(self, campaign, name):
        self.c = campaign
        self.name = name
        self.log_path = f"{campaign.dir}/walrelay-{name}.log"
        self.proc = None
        self.exits = []  # (time since start, exit status)
        self.final_exit = None  # after the run's SIGTERM
        self.rss_peak = 0

    def spawn(self):
        with open(self.log_path, "a") as logf:
            logf.write(f"==== start at {time.monotonic() - self.c.start_time:.1f}s\n")
            logf.flush()
            # In the work directory, with core dumps on: a crash leaves its
            # core beside the logs (core_pattern permitting) for gdb.
            self.proc = subprocess.Popen([self.c.args.walrelay, "--config", f"{self.c.dir}/walrelay.properties"],
                                         stdout=logf, stderr=subprocess.STDOUT, cwd=self.c.dir,
                                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE,
                                                                               (resource.RLIM_INFINITY,
                                                                                resource.RLIM_INFINITY)))

    def admin_port(self):
        with open(self.log_path) as f:
            ports = re.findall(r"admin endpoint listening on 127\.0\.0\.1:(\d+)", f.read())
        return ports[-1] if ports else None

    def state(self):
        """Its state on /slot ("streaming", "standby", ...), or None when it
        does not answer (frozen, starting)."""
        port = self.admin_port()
        if not port:
            return None
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/slot", timeout=1) as r:
                return json.loads(r.read()).get("state")
        except (OSError, ValueError):
            return None

    def sample_rss(self):
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        kib = int(line.split()[1])
                        self.rss_peak = max(self.rss_peak, kib)
        except OSError:
            pass


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


class ThreadHolder:
    """One thread held in one piece by hold_thread.py --until-released
    until release(); the kernel lets it go should this process die."""

    def __init__(self, tid, most=20):
        self.proc = subprocess.Popen([PY, f"{HERE}/hold_thread.py", str(tid), str(most), "--until-released"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        # "held", or why not (then it has ended); a holder that says nothing
        # in 10 s is ended here (the kernel lets the thread go).
        ready, _, _ = select.select([self.proc.stdout], [], [], 10)
        if not ready:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"hold_thread.py {tid}: no word in 10 s")
        first = self.proc.stdout.readline().strip()
        self.said = first if first != "held" else ""
        self.forbidden = False

    def release(self):
        if self.proc.returncode is not None:
            return
        try:
            self.proc.stdin.write("go\n")
            self.proc.stdin.close()
        except BrokenPipeError:  # it has ended already (the thread gone)
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # the kernel lets the thread go
            self.proc.wait()
        out = self.proc.stdout.read()
        self.said = (self.said + " " + out).strip().replace("hold_thread: ", "")
        self.forbidden = self.proc.returncode == 3
        if self.proc.returncode not in (0, 3):
            raise RuntimeError(f"hold_thread.py exited {self.proc.returncode}: {self.said[-300:]}")


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
        if args.sink in ("nats", "rabbitmq", "redis", "http", "sqs"):
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
        self.fault_kinds = args.faults.split(",") if args.faults else self.FAULTS
        unknown = set(self.fault_kinds) - set(self.FAULTS)
        if unknown:
            raise SystemExit(f"--faults: no such fault: {', '.join(sorted(unknown))} (known: {', '.join(self.FAULTS)})")
        self.start_time = time.monotonic()
        self.instances = [Instance(self, "a"), Instance(self, "b")]
        self.proc_lock = threading.Lock()
        self.toxi = None
        self.nemesis_errors = []
        self.tx_seq = 0
        self.tx_lock = threading.Lock()
        # (RabbitMQ and Redis have no message size to refuse.)
        self.oversized_ok = args.sink not in ("rabbitmq", "redis")

    # ---- set-up -------------------------------------------------------------
    def setup(self):
        n = self.name
        cols = "aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload text"
        # wal_sender_timeout 5 s: a frozen walrelay's walsender ends soon, so
        # that the standby takes over within a fault's hold.
        self.pg.must(f"""
ALTER SYSTEM SET logical_decoding_work_mem = '64kB';
ALTER SYSTEM SET wal_sender_timeout = '5s';
SELECT pg_reload_conf();
CREATE TABLE {n}_keyseq (k text PRIMARY KEY, seq bigint NOT NULL);
INSERT INTO {n}_keyseq SELECT 'k' || i, 0 FROM generate_series(0, {len(self.keys) - 1}) i;
CREATE TABLE {n}_a (id text PRIMARY KEY, {cols});
CREATE TABLE {n}_b (id text PRIMARY KEY, {cols});
CREATE TABLE {n}_p (id text, {cols}, PRIMARY KEY (id)) PARTITION BY HASH (id);
CREATE TABLE {n}_p0 PARTITION OF {n}_p FOR VALUES WITH (MODULUS 2, REMAINDER 0);
CREATE TABLE {n}_p1 PARTITION OF {n}_p FOR VALUES WITH (MODULUS 2, REMAINDER 1);
""")
        self.seed_snapshot()
        s = self.s
        self.toxi = Toxiproxy(self.dir, self.args.seed)
        pg_port = self.toxi.proxy("pg", "127.0.0.1:0", f"{s['WALRELAY_TEST_PGHOST']}:{s['WALRELAY_TEST_PGPORT']}")
        cfg = [f"database.hostname=127.0.0.1", f"database.port={pg_port}",
               f"database.user={s['WALRELAY_TEST_PGUSER']}", f"database.dbname={s['WALRELAY_TEST_PGDATABASE']}",
               f"slot.name={n}", f"publication.name={n}", "admin.listen=127.0.0.1:0", "log.level=info",
               "slot.status.interval.ms=1000", "reconnect.backoff.max.ms=2000",
               f"table.include.list=public.{n}_a,public.{n}_b,public.{n}_p",
               f"message.prefix.include.list={n}", f"route.topic.replacement={self.topic}",
               "errors.tolerance=all", f"errors.deadletterqueue.topic.name={self.dead}"]
        if self.args.snapshot_rows:
            cfg += ["snapshot.mode=initial", "snapshot.fetch.size=500"]
        if self.args.retention:
            # Rows deleted once acknowledged (these tables have no time
            # column), under every fault.
            cfg += ["table.retention.policy=delete", "table.retention.ms=0", "table.retention.interval.ms=1000"]
        sink = self.args.sink
        if sink.startswith("kafka"):
            # Through the broker's VIA listener, advertised at the proxy's
            # port (scripts/services.sh): every connection walrelay makes to
            # the broker, the ones metadata names too, goes through the proxy.
            via = s["WALRELAY_TEST_KAFKA_VIA"]
            self.broker_port = self.toxi.proxy("broker", via, s["WALRELAY_TEST_KAFKA_VIA_UPSTREAM"])
            cfg += [f"kafka.bootstrap.servers={via}", f"kafka.message.max.bytes={SIZE_LIMIT}"]
            if sink == "kafka-eos":
                # The initial snapshot is one Kafka transaction, so it must end
                # within the time-out (less a margin): 100,000 rows took 33 s
                # beside a loaded CI run, past 30 s, and both walrelays halted.
                # (The broker's transaction.max.timeout.ms is 15 minutes.)
                cfg += ["exactly.once.support=required", "kafka.transaction.timeout.ms=120000",
                        "transaction.boundary.interval.ms=100"]
            self.create_kafka_topics()
        elif sink == "nats":
            port = self.toxi.proxy("broker", "127.0.0.1:0", s["WALRELAY_TEST_NATS"].split("//", 1)[1])
            self.broker_port = port
            cfg += ["sink.type=nats-jetstream", f"sink.nats-jetstream.url=nats://127.0.0.1:{port}",
                    "sink.nats-jetstream.ack.timeout.ms=3000"]
            self.nats("stream-add", "--name", f"{n}_main", "--subjects", self.topic, "--max-msg-size",
                      str(SIZE_LIMIT), "--duplicate-window", "600")
            self.nats("stream-add", "--name", f"{n}_dlq", "--subjects", self.dead, "--duplicate-window", "600")
        elif sink == "rabbitmq":
            port = self.toxi.proxy("broker", "127.0.0.1:0", s["WALRELAY_TEST_RABBITMQ"])
            self.broker_port = port
            cfg += ["sink.type=rabbitmq", "sink.rabbitmq.connection.host=127.0.0.1",
                    f"sink.rabbitmq.connection.port={port}", f"sink.rabbitmq.exchange={n}_x",
                    "sink.rabbitmq.ackTimeout=5000", "sink.rabbitmq.connection.requested.heartbeat=2"]
            self.rabbit("declare", "--exchange", f"{n}_x", "--queue", f"{n}_q", "--binding", self.topic)
            self.rabbit("declare", "--exchange", f"{n}_x", "--queue", f"{n}_dlq", "--binding", self.dead)
        elif sink == "redis":
            port = self.toxi.proxy("broker", "127.0.0.1:0", s["WALRELAY_TEST_REDIS"])
            self.broker_port = port
            cfg += ["sink.type=redis", f"sink.redis.address=127.0.0.1:{port}", "sink.redis.socket.timeout.ms=3000"]
        elif sink == "http":
            # The project's receiver, behind the proxy; it answers 413 to a
            # body over the limit (the oversized rows go to the dead letters).
            port = self.toxi.proxy("broker", "127.0.0.1:0", s["WALRELAY_TEST_HTTP"])
            self.broker_port = port
            cfg += ["sink.type=http", f"sink.http.url=http://127.0.0.1:{port}/${{topic}}", "sink.http.timeout.ms=5000",
                    "sink.http.retry.interval.ms=200", "sink.http.retries=3"]
            self.http("fault", "--prefix", self.topic, "--status", "413", "--min-size", str(SIZE_LIMIT))
        elif sink == "sqs":
            # ElasticMQ behind the proxy, FIFO queues made here (walrelay
            # makes none); SQS refuses a message over 256 KiB (the
            # oversized rows, SQS_OVERSIZE, go to the dead letters).
            upstream = s["WALRELAY_TEST_SQS"].split("//", 1)[1]
            port = self.toxi.proxy("broker", "127.0.0.1:0", upstream)
            self.broker_port = port
            cfg += ["sink.type=sqs", f"sink.sqs.queue.url=http://127.0.0.1:{port}/000000000000/${{topic}}.fifo",
                    "sink.sqs.region=us-east-1", "sink.sqs.timeout.ms=5000", "sink.sqs.retry.interval.ms=200",
                    "sink.sqs.retries=3"]
            # As the AWS CLI reads them (ElasticMQ takes any), for walrelay.
            os.environ.update(AWS_ACCESS_KEY_ID="walrelay-campaign", AWS_SECRET_ACCESS_KEY="walrelay-campaign-secret")
            self.sqs("create", "--queue", self.sqs_queue(self.topic) + ".fifo")
            self.sqs("create", "--queue", self.sqs_queue(self.dead) + ".fifo")
        with open(f"{self.dir}/walrelay.properties", "w") as f:
            f.write("\n".join(cfg) + "\n")

    def seed_snapshot(self):
        """Rows already in the outbox when walrelay first starts: the initial
        snapshot sends them (snapshot.mode=initial), under the first faults.
        Their ids sort in insertion order (the snapshot's ORDER BY id), and
        their keys' sequence numbers grow with it."""
        n, rows, keys = self.name, self.args.snapshot_rows, len(self.keys)
        if not rows:
            return
        self.pg.must(f"""
BEGIN;
INSERT INTO {n}_a (id, aggregatetype, aggregateid, type, payload)
SELECT 's0_' || lpad(g::text, 7, '0'), 'campaign', 'k' || (g % {keys}), 'snapshot',
       json_build_object('id', 's0_' || lpad(g::text, 7, '0'), 'key', 'k' || (g % {keys}),
                         'seq', (g - 1) / {keys} + 1, 'pad', repeat('x', 200))::text
FROM generate_series(1, {rows}) g;
UPDATE {n}_keyseq SET seq = (SELECT count(*) FROM {n}_a WHERE aggregateid = k);
COMMIT;
""")
        self.history.record(0, "snapshot", "committed",
                            [{"id": f"s0_{g:07d}", "key": f"k{g % keys}", "oversized": False, "fate": None}
                             for g in range(1, rows + 1)])

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

    def http(self, *a, check=True):
        r = subprocess.run([PY, f"{ROOT}/tests/integration/http/read.py", *a, "--store",
                            f"{self.run_dir}/http/store"], capture_output=True, text=True, timeout=600)
        if check and r.returncode != 0:
            raise RuntimeError(f"http read.py {a}: {r.stderr}")
        return r.stdout

    @staticmethod
    def sqs_queue(topic):
        return "".join(c if c.isalnum() or c in "-_" else "_" for c in topic)

    def sqs(self, *a, check=True):
        r = subprocess.run([PY, f"{ROOT}/tests/integration/sqs/read.py", "--endpoint", self.s["WALRELAY_TEST_SQS"],
                            "--store", f"{self.run_dir}/sqs/store", *a], capture_output=True, text=True, timeout=600)
        if check and r.returncode != 0:
            raise RuntimeError(f"sqs read.py {a}: {r.stderr}")
        return r.stdout

    def redis(self, *a, check=True):
        r = subprocess.run([PY, f"{ROOT}/tests/integration/redis/read.py", "--url", self.s["WALRELAY_TEST_REDIS"],
                            *a], capture_output=True, text=True, timeout=600)
        if check and r.returncode != 0:
            raise RuntimeError(f"redis read.py {a}: {r.stderr}")
        return r.stdout

    # ---- walrelay under a supervisor ---------------------------------------------
    def supervisor(self):
        """Restarts each walrelay whenever it exits, as systemd's
        Restart=always would, and samples their RSS."""
        while not self.stop_all.is_set():
            with self.proc_lock:
                for inst in self.instances:
                    if inst.proc is None:
                        continue
                    code = inst.proc.poll()
                    if code is not None:
                        inst.exits.append((round(time.monotonic() - self.start_time, 1), code))
                        log(f"walrelay {inst.name} exited {code}; restarting")
                        time.sleep(0.5)
                        inst.spawn()
                    else:
                        inst.sample_rss()
            time.sleep(0.5)

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
        # (SQS takes 256 KiB whatever a queue's MaximumMessageSize says, in ElasticMQ.)
        size = (SQS_OVERSIZE if self.args.sink == "sqs" else OVERSIZE) if oversized else pad
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
    FAULTS = ["kill9", "sigstop_takeover", "broker_restart", "broker_kill9", "broker_freeze", "pg_restart",
              "walsender_terminate", "net_latency", "net_stall", "net_reset", "net_down", "loop_starved",
              "sink_thread_ahead"]

    def services(self, *a):
        """scripts/services.sh on the group's servers; a failure raises (a
        fault that could not be injected, or a heal that did not heal)."""
        env = dict(os.environ, WALRELAY_SERVICES_GROUP=self.args.group)
        r = subprocess.run([f"{ROOT}/scripts/services.sh", *a], env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"services.sh {' '.join(a)} failed: {r.stdout[-500:]}{r.stderr[-500:]}")

    def broker(self):
        return {"kafka": "kafka", "kafka-eos": "kafka", "nats": "nats", "rabbitmq": "rabbitmq",
                "redis": "redis", "http": "http", "sqs": "sqs"}[self.args.sink]

    def broker_pid(self):
        with open(f"{self.run_dir}/{self.broker()}/pid") as f:
            return int(f.read().strip())

    def active(self, rng):
        """The walrelay that holds the slot (not a standby by its /slot; its
        /readyz also says whether the broker answers), else either."""
        holding = [i for i in self.instances if i.state() not in (None, "standby")]
        return holding[0] if len(holding) == 1 else rng.choice(self.instances)

    def slot_holder(self):
        """The pid of the walsender holding the slot, or "" (none, or the
        server unreachable)."""
        code, out = self.pg.run(f"SELECT active_pid FROM pg_replication_slots WHERE slot_name = '{self.name}';",
                                timeout=10)
        return out.strip() if code == 0 else ""

    def fault(self, rng, kind):
        t = round(time.monotonic() - self.start_time, 1)
        hold = round(rng.uniform(1, 6), 1)
        # The network faults' side: walrelay to PostgreSQL, or to the broker.
        link = rng.choice(["pg", "broker"]) if kind.startswith("net_") else None
        entry = [t, kind, hold] + ([link] if link else [])
        self.schedule.append(entry)
        self.history.note({"fault": kind, "at": t, "hold": hold, "link": link})
        log(f"fault at {t}s: {kind} ({hold}s){' on ' + link if link else ''}")
        if kind == "kill9":
            with self.proc_lock:
                rng.choice(self.instances).proc.send_signal(signal.SIGKILL)
        elif kind == "sigstop_takeover":
            self.sigstop_takeover(rng, entry)
        elif kind == "broker_restart" or (kind == "broker_kill9" and self.broker() == "rabbitmq"):
            # (RabbitMQ: a clean stop and start only; its restart takes long
            # enough as it is.)
            b = self.broker()
            self.services(f"{b}-stop")
            time.sleep(hold)
            self.services(f"{b}-start")
        elif kind == "broker_kill9":
            os.kill(self.broker_pid(), signal.SIGKILL)
            time.sleep(hold)
            self.services(f"{self.broker()}-start")
        elif kind == "broker_freeze":
            pid = self.broker_pid()
            os.kill(pid, signal.SIGSTOP)
            time.sleep(hold)
            os.kill(pid, signal.SIGCONT)
        elif kind == "pg_restart":
            self.services("pg-restart", "immediate")
        elif kind == "walsender_terminate":
            code, out = self.pg.run(f"SELECT count(pg_terminate_backend(active_pid)) FROM pg_replication_slots "
                                    f"WHERE slot_name = '{self.name}' AND active_pid IS NOT NULL;")
            # None to end (a walrelay between sessions) is a fault that did
            # not happen: said in the schedule, not an error.
            entry.append("terminated" if code == 0 and out.strip() == "1" else f"none active ({out.strip()[:80]})")
        elif kind == "net_latency":
            # Every byte each way late by 0.1-1.5 s, with jitter.
            ms = rng.randint(100, 1500)
            for stream in ("downstream", "upstream"):
                self.toxi.toxic(link, f"latency_{stream}", "latency", {"latency": ms, "jitter": ms // 4}, stream)
            time.sleep(hold)
            for stream in ("downstream", "upstream"):
                self.toxi.untoxic(link, f"latency_{stream}")
        elif kind == "net_stall":
            # Nothing gets through for the hold, then all of it, in order
            # (connections stay open: a stalled path, not a lost one).
            for stream in ("downstream", "upstream"):
                self.toxi.toxic(link, f"stall_{stream}", "latency", {"latency": int(hold * 1000), "jitter": 0},
                                stream)
            time.sleep(hold)
            for stream in ("downstream", "upstream"):
                self.toxi.untoxic(link, f"stall_{stream}")
        elif kind == "net_reset":
            # Connections reset by peer as data flows, new ones too, for a
            # moment.
            self.toxi.toxic(link, "reset", "reset_peer", {"timeout": 0}, "downstream")
            time.sleep(min(hold, 2))
            self.toxi.untoxic(link, "reset")
        elif kind == "loop_starved":
            self.loop_starved(rng, hold, entry)
        elif kind == "sink_thread_ahead":
            self.sink_thread_ahead(rng, entry)
        elif kind == "net_down":
            # The path gone: connections closed, new ones refused.
            self.toxi.enabled(link, False)
            time.sleep(hold)
            self.toxi.enabled(link, True)

    def loop_starved(self, rng, hold, entry):
        """The active walrelay's event loop starved (held in slices of 5-40
        ms, 1-5 ms of running between; hold_thread.py) while its other
        threads run on, and its connections to the broker aborted once
        meanwhile, with what was on the way to the broker lost: the sink's
        threads act on the loss before the loop hears of it."""
        with self.proc_lock:
            pid = self.active(rng).proc.pid
        out = ""
        holder = subprocess.Popen([PY, f"{HERE}/hold_thread.py", str(pid), str(hold), "--seed",
                                   str(rng.randrange(2**31))], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True)
        try:
            time.sleep(rng.uniform(0.1, hold / 2))
            # What walrelay sends the broker held up on the way for a moment,
            # then its connections aborted (ss -K: the socket destroyed, new
            # ones let in): what was on the way is lost, and the sink's
            # thread connects again at once, while the loop is still slow.
            self.toxi.toxic("broker", "held_upstream", "latency", {"latency": 5000, "jitter": 0}, "upstream")
            try:
                time.sleep(rng.uniform(0.05, 0.5))
                self.abort_broker_connections()
            finally:
                self.toxi.untoxic("broker", "held_upstream")
            out, _ = holder.communicate(timeout=hold + 30)
        finally:
            if holder.poll() is None:
                holder.kill()  # the kernel lets the thread go
                holder.wait()
        if holder.returncode == 3:  # ptrace forbidden on this machine: the loop ran on
            log(f"  {out.strip()}")
        elif holder.returncode != 0:
            raise RuntimeError(f"hold_thread.py exited {holder.returncode}: {out[-300:] if out else ''}")
        entry.append(out.strip().replace("hold_thread: ", ""))

    def abort_broker_connections(self):
        """walrelay's connections to the broker (through the proxy) aborted:
        ss -K destroys the sockets, and new ones are let in at once."""
        r = subprocess.run(["ss", "-K", "dst", "127.0.0.1", "dport", "=", str(self.broker_port)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"ss -K: {r.stderr.strip()}")

    def sink_threads(self, pid):
        """The threads of walrelay `pid` that talk to the broker: RabbitMQ's
        connection thread; librdkafka's broker threads (all of them: the one
        of the bootstrap address keeps the name rdk:broker-1 once it learns
        its node id, as the internal and the coordinator's threads are
        named); for NATS every one but the loop (nats.c's threads have no
        names). Empty if walrelay is gone."""
        names = {}
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/comm") as f:
                    names[int(tid)] = f.read().strip()
        except OSError:
            return []
        prefix = {"rabbitmq": "wr-rabbitmq", "kafka": "rdk:broker", "redis": "wr-redis",
                  "http": "wr-http", "sqs": "wr-sqs"}.get(self.broker(), "")
        return sorted(t for t, n in names.items() if t != pid and n.startswith(prefix))

    def sink_thread_ahead(self, rng, entry):
        """A sink's threads act on a lost connection before the loop hears
        of it, with records queued for them: what they had sent dropped on
        the way (lost, not delivered), the threads held while the loop hands
        them more (they queue), then the loop held, the connections to the
        broker aborted (ss -K) and the threads let go alone for 0.3-1.5 s -
        they find the connection gone and connect again - before the loop
        runs and sees the failures. Threads descheduled at the wrong
        moments; a sink that sends what was queued behind a failure on the
        new connection breaks per-key order here."""
        with self.proc_lock:
            pid = self.active(rng).proc.pid
        tids = self.sink_threads(pid)
        if not tids:
            entry.append("no sink thread (walrelay gone)")
            return
        holders = []
        dropping = True
        try:
            self.toxi.toxic("broker", "dropped_upstream", "timeout", {"timeout": 0}, "upstream")
            time.sleep(rng.uniform(0.05, 0.3))  # what the thread sends now is lost on the way
            for tid in tids:
                holders.append(ThreadHolder(tid))
            time.sleep(rng.uniform(0.1, 1.0))  # the loop hands them records meanwhile
            loop = ThreadHolder(pid)
            holders.append(loop)
            self.abort_broker_connections()
            self.toxi.untoxic("broker", "dropped_upstream")
            dropping = False
            for h in holders[:-1]:
                h.release()
            time.sleep(rng.uniform(0.3, 1.5))
            loop.release()
        finally:
            # Each step whatever the one before did: a thread left held, or
            # every connection to the broker left black-holed, would stand
            # in for faults of their own until the heal.
            failures = []
            for undo in [h.release for h in holders] + ([lambda: self.toxi.untoxic("broker", "dropped_upstream")]
                                                        if dropping else []):
                try:
                    undo()
                except Exception as e:  # noqa: BLE001 - the first one raises below
                    failures.append(e)
            if failures:
                raise failures[0]
        said = "; ".join(h.said for h in holders)
        if any(h.forbidden for h in holders):
            log(f"  {said}")
        entry.append(f"threads {tids} ({said})")

    def sigstop_takeover(self, rng, entry):
        """The active walrelay frozen until the standby holds the slot (its
        walsender ends at wal_sender_timeout), then thawed: it finds its
        session gone, and its producer fenced in exactly-once mode."""
        with self.proc_lock:
            victim = self.active(rng)
            proc = victim.proc
        other = next(i for i in self.instances if i is not victim)
        before = self.slot_holder()
        proc.send_signal(signal.SIGSTOP)
        # Taken over: the slot held by another walsender than at the freeze
        # (the frozen one makes no new one), whatever the broker's health. A
        # victim that held nothing (a standby, or between sessions) sees the
        # other one hold it or take it.
        deadline = time.monotonic() + 45
        took_over = False
        while time.monotonic() < deadline and not self.stop_all.is_set():
            now = self.slot_holder()
            if now and (now != before or other.state() not in (None, "standby")):
                took_over = True
                break
            time.sleep(0.5)
        proc.send_signal(signal.SIGCONT)
        entry.append(f"{victim.name} frozen, {other.name} {'took over' if took_over else 'did not take over'}")
        if not took_over and not self.stop_all.is_set():
            # The standby must take the slot once the frozen one's walsender
            # times out (5 s): a standby that does not is a finding.
            self.nemesis_errors.append(f"sigstop_takeover at {entry[0]} s: {entry[-1]} within 45 s")
        log(f"  {entry[-1]}")

    def nemesis(self):
        rng = random.Random(self.args.seed * 7 + 1)
        # The first fault: kill -9 of the walrelay taking the initial snapshot,
        # at a random moment of it (after a random number of its rows: 100,000
        # rows take from 0.7 s on an idle machine to several on a loaded one),
        # so that every run resumes an interrupted snapshot, with events that
        # leave no row (a row inserted and deleted, a logical message)
        # committed meanwhile.
        # (A snapshot too slow to reach it in 15 s, or taken again after a
        # broker time-out, is killed at 15 s all the same: the faults go on.)
        target = rng.randint(500, self.args.snapshot_rows * 8 // 10) if self.args.snapshot_rows else 0
        if self.args.snapshot_rows and (self.snapshot_rows_reach(target, timeout=15) or not self.stop_faults.is_set()):
            t = round(time.monotonic() - self.start_time, 1)
            self.schedule.append([t, "kill9_in_snapshot", 0])
            self.history.note({"fault": "kill9_in_snapshot", "at": t})
            log(f"fault at {t}s: kill9_in_snapshot")
            with self.proc_lock:
                self.instances[0].proc.send_signal(signal.SIGKILL)
            # The other faults once the resumed snapshot is done: a walrelay
            # frozen in the middle of one keeps its walsender busy running SQL,
            # past wal_sender_timeout, so no standby can take over until it is
            # thawed (a known limit, docs/reliability.md).
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not self.stop_faults.is_set() and not self.snapshot_done():
                time.sleep(0.5)
        wait = rng.uniform(1, 4)
        while not self.stop_faults.wait(wait):
            kind = rng.choice(self.fault_kinds)
            try:
                self.fault(rng, kind)
            except Exception as e:  # a fault that could not be injected fails the run, not just this thread
                self.nemesis_errors.append(f"{kind}: {e!r}")
                log(f"fault {kind} failed: {e!r}")
            wait = rng.uniform(2, 7)

    def snapshot_rows_reach(self, target, timeout=60):
        """Waits until the first walrelay has handed `target` rows of its
        initial snapshot to the sink (walrelay_snapshot_rows_total), polling
        every 5 ms; False on a stop, a time-out or that walrelay gone."""
        first = self.instances[0]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.stop_faults.is_set():
            if first.proc.poll() is not None:
                return False
            port = first.admin_port()
            if port:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
                        m = re.search(rb"^walrelay_snapshot_rows_total (\S+)$", r.read(), re.M)
                    if m and float(m.group(1)) >= target:
                        return True
                except OSError:
                    pass
            time.sleep(0.005)
        return False

    # ---- healing and reading -----------------------------------------------------
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
        if sink == "redis":
            return {"main": parse(self.redis("read", "--prefix", self.topic)),
                    "dead": parse(self.redis("read", "--prefix", self.dead))}
        if sink == "http":
            return {"main": parse(self.http("read", "--prefix", self.topic)),
                    "dead": parse(self.http("read", "--prefix", self.dead))}
        if sink == "sqs":
            return {"main": parse(self.sqs("read", "--prefix", self.sqs_queue(self.topic) + ".fifo")),
                    "dead": parse(self.sqs("read", "--prefix", self.sqs_queue(self.dead) + ".fifo"))}
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
            exactly_once = stream == "read_committed" or sink in ("nats", "redis")
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
            # (Redis: an initial snapshot's rows carry no entry id of the
            # stream's, so one taken again sends them again: at least once.)
            dups = [i for i, c in seen.items() if c > 1
                    and not (sink == "redis" and ev.get(i, {}).get("shape") == "snapshot")]
            if exactly_once and dups:
                problems.append(f"{stream}: {len(dups)} events more than once, first {dups[0]} ({seen[dups[0]]}x)")
            self.stats[stream] = {"records": len(records), "distinct": len(seen), "duplicates": len(dups),
                                  "order_breaks": len(order_breaks), "missing": len(missing)}
        peak = max(inst.rss_peak for inst in self.instances)
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
        with self.proc_lock:
            self.instances[0].spawn()
        sup = threading.Thread(target=self.supervisor, daemon=True)
        sup.start()
        # The writers start once the slot exists: what they commit is in the
        # stream, what was there before in the snapshot. The standby starts
        # then too (the first to start makes the slot and takes the snapshot).
        deadline = time.monotonic() + 60
        while self.pg.run(f"SELECT 1 FROM pg_replication_slots WHERE slot_name = '{self.name}';")[1].strip() != "1":
            if time.monotonic() > deadline:
                raise RuntimeError("walrelay did not create its slot within 60 s")
            time.sleep(0.2)
        with self.proc_lock:
            self.instances[1].spawn()
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
        # a frozen one thawed by its fault's own end), every proxy clean, then
        # a quiet tail.
        self.services("start", *([self.broker()] if self.broker() != "kafka" else []))
        self.toxi.heal()
        time.sleep(3)
        self.stop_writers.set()
        for w in writers:
            w.join()
        caught = self.catch_up()
        rows_left = self.wait_retention() if args.retention and caught else None
        self.stop_all.set()
        sup.join()
        with self.proc_lock:
            for inst in self.instances:
                inst.proc.send_signal(signal.SIGTERM)
            for inst in self.instances:
                try:
                    inst.final_exit = inst.proc.wait(60)
                except subprocess.TimeoutExpired:
                    inst.proc.kill()
                    inst.final_exit = "no exit within 60 s of SIGTERM"
        got = self.read()
        problems = [] if caught else ["the slot did not catch up with the last write within 240 s"]
        if rows_left:
            problems.append(f"retention: {rows_left} acknowledged rows still in the outbox 60 s after the catch-up")
        # The premise: a leg that injected no fault, or wrote no event of a
        # committed shape, would pass without testing what it is for.
        if not args.no_faults and not self.schedule:
            problems.append("no fault was injected")
        problems += [f"a fault failed: {e}" for e in self.nemesis_errors]
        # walrelay's own exits are 0, 1 (a signal while draining, a fenced
        # producer), 2 (a bad configuration: none here), 3 (a halt); killed by
        # a signal, only by the nemesis's SIGKILL. Anything else is a crash.
        problems += self.check_exits()
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
        for k in (entry[1] for entry in self.schedule):
            kinds[k] = kinds.get(k, 0) + 1
        summary = {"seed": args.seed, "sink": args.sink, "events": counts, "faults": kinds,
                   "snapshot_interrupted": self.snapshot_interrupted(),
                   "transactions": {f"{sh}/{fate}": c for (sh, fate), c in sorted(self.history.tx_counts.items())},
                   "walrelay_exits": {i.name: i.exits for i in self.instances},
                   "peak_rss_kib": {i.name: i.rss_peak for i in self.instances},
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

    def check_exits(self):
        """Every way walrelay ended but the nemesis's SIGKILL and a fenced
        zombie's exit 1 (exactly once) is a problem here: no halt is expected
        of this workload (errors.tolerance=all: oversized rows go to the
        dead-letter topic), and with halt.action=stay a halt does not even
        exit, so the logs are read for one too."""
        problems = []
        kills = sum(1 for entry in self.schedule if entry[1] in ("kill9", "kill9_in_snapshot"))
        for inst in self.instances:
            with open(inst.log_path) as f:
                text = f.read()
            # (Exactly once: a zombie fenced by the walrelay that took over
            # stops with exit 1 and a "halted: ... took over)" line: that is
            # the fence working.)
            zombie = self.args.sink == "kafka-eos"
            halts = [h for h in re.findall(r"^.* halted: .*$", text, re.M) if not (zombie and "took over)" in h)]
            if halts:
                problems.append(f"walrelay {inst.name} halted: {halts[0][:400]}")
            fenced = "took over)" in text
            for at, code in inst.exits + [("the end", inst.final_exit)]:
                if isinstance(code, str):
                    problems.append(f"walrelay {inst.name}: {code}; see {inst.log_path}")
                    continue
                if code is None or code == 0 or code == -signal.SIGKILL:
                    continue
                if code == 1 and fenced and self.args.sink == "kafka-eos":
                    continue
                what = (f"killed by signal {-code} ({signal.Signals(-code).name}); any core is in {self.dir}"
                        if code < 0 else f"exit {code}")
                problems.append(f"walrelay {inst.name} ended at {at} s: {what}; see {inst.log_path}")
        sigkills = sum(1 for inst in self.instances for _, code in inst.exits if code == -signal.SIGKILL)
        if sigkills > kills:
            # (The OOM killer's SIGKILL is not the nemesis's.)
            problems.append(f"{sigkills} walrelay exits by SIGKILL, {kills} kill -9 injected")
        if self.args.snapshot_rows and not self.args.no_faults and not self.snapshot_interrupted():
            problems.append("the first kill -9 came after the initial snapshot was done (the premise of resuming "
                            "an interrupted snapshot did not hold)")
        return problems

    def delete_held_rows(self):
        """What docs/operations.md asks of the operator for rows written
        before walrelay relayed a table (those the slot's view at its
        consistent point saw, unless an initial snapshot sent them, and those
        below a floor given at the first retention run): once they are known
        to be in the broker (the checker reads every committed event there),
        delete them by hand. Those below each table's floor, or seen by the
        view, as the slot's marker keeps them; the rest walrelay deletes. The
        rows deleted."""
        n = self.name
        code, out = self.pg.run(f"SELECT obj_description(oid, 'pg_publication') FROM pg_publication "
                                f"WHERE pubname = '{n}';", timeout=10)
        line = next((l for l in out.splitlines() if l.startswith(f"walrelay.slot={n} ")), "") if code == 0 else ""
        m = re.search(r"retention_floors=([0-9:,]+)", line)
        if not m:
            return 0
        now = "(SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint)"
        xid8 = f"({now} - (({now} % 4294967296 - xmin::text::bigint + 4294967296) % 4294967296))"
        view = re.search(r" slot_view=([0-9:,]+)", line)
        seen = f"pg_visible_in_snapshot({xid8}::text::xid8, '{view.group(1)}'::pg_snapshot)" if view else "false"
        deleted = 0
        for entry in m.group(1).split(","):
            oid, floor = entry.split(":")[:2]
            code, table = self.pg.run(f"SELECT {oid}::regclass;", timeout=10)
            if code != 0 or not table.strip():
                continue
            code, out = self.pg.run(f"WITH gone AS (DELETE FROM {table.strip()} WHERE {xid8} < {floor} OR ({floor} > 0 AND {seen}) "
                                    f"RETURNING 1) SELECT count(*) FROM gone;", timeout=60)
            if code == 0 and out.strip().isdigit():
                deleted += int(out.strip())
        log(f"retention: deleted {deleted} rows written before walrelay relayed their tables, by hand")
        return deleted

    def wait_retention(self, timeout=60):
        """With --retention (table.retention.ms=0): once the slot has caught
        up, every row is acknowledged, so the active walrelay deletes them
        all, once the rows from before its floors are deleted by hand. The
        rows left after `timeout` (0: none)."""
        n = self.name
        self.delete_held_rows()
        deadline = time.monotonic() + timeout
        while True:
            code, out = self.pg.run(f"SELECT (SELECT count(*) FROM {n}_a) + (SELECT count(*) FROM {n}_b) + "
                                    f"(SELECT count(*) FROM {n}_p);", timeout=10)
            left = int(out.strip()) if code == 0 and out.strip().isdigit() else -1
            if left == 0 or time.monotonic() > deadline:
                return left
            time.sleep(0.5)

    def snapshot_done(self):
        for inst in self.instances:
            try:
                with open(inst.log_path) as f:
                    if "initial snapshot done" in f.read():
                        return True
            except OSError:
                pass
        return False

    def snapshot_interrupted(self):
        """Whether the first walrelay died before its snapshot was done (the
        first fault's premise: the runs after it resume it)."""
        with open(self.instances[0].log_path) as f:
            first_run = f.read().split("==== start at")[1]
        return "initial snapshot of" in first_run and "initial snapshot done" not in first_run

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
        elif self.args.sink == "redis":
            self.redis("delete", "--prefix", self.topic, check=False)
            self.redis("delete", "--prefix", self.dead, check=False)
        elif self.args.sink == "http":
            self.http("delete", "--prefix", self.topic, check=False)
            self.http("delete", "--prefix", self.dead, check=False)
        elif self.args.sink == "sqs":
            self.sqs("delete", "--prefix", self.sqs_queue(self.topic), check=False)
            self.sqs("delete", "--prefix", self.sqs_queue(self.dead), check=False)
        elif self.args.sink.startswith("kafka"):
            from confluent_kafka.admin import AdminClient
            AdminClient({"bootstrap.servers": self.s["WALRELAY_TEST_KAFKA"]}).delete_topics([self.topic, self.dead])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sink", required=True, choices=["kafka", "kafka-eos", "nats", "rabbitmq", "redis", "http", "sqs"])
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--duration", type=float, default=60)
    p.add_argument("--no-faults", action="store_true")
    p.add_argument("--faults", default=None,
                   help="the fault kinds to draw from, comma-separated (default: all of them)")
    p.add_argument("--retention", action="store_true",
                   help="table.retention.policy=delete with table.retention.ms=0: the outbox is emptied as it goes")
    p.add_argument("--snapshot-rows", type=int, default=100000,
                   help="rows in the outbox before walrelay starts, sent by the initial snapshot (0: none)")
    p.add_argument("--group", default=os.environ.get("WALRELAY_SERVICES_GROUP", "campaign"))
    p.add_argument("--walrelay", default=f"{ROOT}/build/walrelay")
    p.add_argument("--workdir", default=None)
    args = p.parse_args()
    args.walrelay = os.path.abspath(args.walrelay)  # walrelay runs in the work directory
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 2**31)
    print(f"campaign seed: {args.seed}", flush=True)
    # SIGTERM (ctest's time-out, an operator) ends the run through the clean-up
    # below, as Ctrl-C does: no walrelay, proxy or frozen broker left behind.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    c = Campaign(args)
    try:
        return c.run()
    finally:
        c.stop_all.set()
        c.stop_faults.set()
        for inst in c.instances:
            if inst.proc and inst.proc.poll() is None:
                inst.proc.send_signal(signal.SIGCONT)
                inst.proc.kill()
        try:
            os.kill(c.broker_pid(), signal.SIGCONT)  # a broker_freeze cut short
        except (OSError, ValueError):
            pass
        if c.toxi:
            c.toxi.stop()


if __name__ == "__main__":
    sys.exit(main())
