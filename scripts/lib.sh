# shellcheck shell=bash
# Shell helpers shared by services.sh, kafka-jars.sh, fault/kafka-sasl.sh and
# bench/debezium/jars.sh. Source it; it defines functions and CACHE_ROOT only.

export CACHE_ROOT="${WALRELAY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/walrelay}"
WALRELAY_SCRIPTS="${WALRELAY_SCRIPTS:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}"

# alive PID: the process runs. A zombie (killed, not yet reaped by its
# parent: a server killed with -9 whose parent is a PID 1 that reaps late)
# does not, though kill -0 says it does.
alive() { kill -0 "$1" 2>/dev/null && [[ $(ps -o stat= -p "$1" 2>/dev/null) != Z* ]]; }

# free_port: a free loopback port; free_ports N: the first of N consecutive
# ones. Chosen below the kernel's ephemeral range. A server restarted on its port
# (kafka-start, rabbitmq-start, ...) must find it free again: a port from the
# ephemeral range can meanwhile be taken as the local port of any outgoing
# connection (a client retrying, a test's HTTP request), and the restart then
# fails with "address in use". Nor is a port that a run directory of these
# scripts names (its servers' port files, and the three after each: Kafka's
# controller and proxy ports, RabbitMQ's distribution port) chosen while its
# server is stopped: a failover test's stopped primary keeps its port, and a
# server of another test that took it would answer the clients that still
# try it (main-suite run 6: with the primary down, a server there took the
# replay's connection and closed it, "server closed the connection
# unexpectedly", and libpq never tried the next host).
free_port() { free_ports 1; }
free_ports() {
  python3 - "$1" <<'PY'
import glob, random, socket, sys
n = int(sys.argv[1])
named = set()
for pattern in ("/tmp/walrelay-run-*/*/port", "/tmp/walrelay-run-*/*/*_port", "/tmp/walrelay-run-*/pg/standby/port",
                "/tmp/walrelay-mutation-*/*/port", "/tmp/walrelay-mutation-*/*/*_port",
                "/tmp/walrelay-mutation-*/pg/standby/port"):
    for f in glob.glob(pattern):
        try:
            p = int(open(f).read().strip())
        except (OSError, ValueError):
            continue
        named.update(range(p, p + 4))
try:
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except OSError:
    low = 32768
hi = max(low - n, 2048)
for _ in range(1000):
    first = random.randint(min(10000, hi - 1000), hi)
    if named.intersection(range(first, first + n)):
        continue
    held = []
    try:
        for p in range(first, first + n):
            s = socket.socket()
            held.append(s)
            s.bind(("127.0.0.1", p))
    except OSError:
        continue
    finally:
        for s in held:
            s.close()
    print(first)
    break
else:
    sys.exit("free_port: no free port below the ephemeral range")
PY
}

# maven_fetch DIR NAME DEPENDENCY_XML: copies the runtime closure of the given
# <dependency> elements from Maven Central into DIR/libs, once. A finished
# fetch leaves DIR/.complete and is reused without touching the network.
maven_fetch() {
  local dir="$1" name="$2" deps="$3"
  [[ -f "$dir/.complete" ]] && return 0
  mkdir -p "$dir/libs"
  local work; work=$(mktemp -d)
  cat > "$work/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>walrelay</groupId><artifactId>$name</artifactId><version>1</version>
  <dependencies>
$deps
  </dependencies>
</project>
POM
  if ! ( cd "$work" && mvn -q -B dependency:copy-dependencies -DoutputDirectory="$dir/libs" -DincludeScope=runtime >&2 ); then
    rm -rf "$work"; return 1
  fi
  rm -rf "$work"
  touch "$dir/.complete"
}

# kafka_configure DIR PORT CPORT PROTOCOL [EXTRA_PROPERTIES]: a single-node
# KRaft broker+controller on loopback whose client listener speaks PROTOCOL
# (PLAINTEXT, SASL_PLAINTEXT, ...), data in DIR/data, log in DIR/server.log;
# then formats its storage.
kafka_configure() {
  local dir="$1" port="$2" cport="$3" protocol="$4" extra="${5:-}"
  mkdir -p "$dir"
  cat > "$dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=$protocol://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=$protocol://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=$protocol
listener.security.protocol.map=$protocol:$protocol,CONTROLLER:PLAINTEXT
log.dirs=$dir/data
auto.create.topics.enable=true
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
$extra
PROPS
  cat > "$dir/log4j.properties" <<LOG
log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File=$dir/server.log
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
LOG
  local cp; cp=$(kafka_classpath)
  local cluster_id; cluster_id=$(java -cp "$cp" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -1)
  java -cp "$cp" "-Dlog4j.configuration=file:$dir/log4j.properties" kafka.tools.StorageTool format \
    -t "$cluster_id" -c "$dir/server.properties" >"$dir/format.log" 2>&1 \
    || { cat "$dir/format.log" >&2; return 1; }
}

# The broker's jars (fetched on first use); a java -cp value.
kafka_classpath() { echo "$("$WALRELAY_SCRIPTS/kafka-jars.sh")/libs/*"; }

# kafka_launch DIR "HEAP_OPTS" PORT [KCAT_ARGS...]: starts the broker
# configured in DIR in the background (pid in DIR/pid) and waits until kcat,
# with the given client settings, sees it answer metadata requests.
kafka_launch() {
  local dir="$1" heap="$2" port="$3"; shift 3
  local cp; cp=$(kafka_classpath)
  # shellcheck disable=SC2086  # HEAP_OPTS is a list of JVM options
  nohup java $heap -XX:+UseG1GC -Djava.awt.headless=true \
    "-Dlog4j.configuration=file:$dir/log4j.properties" -Dkafka.logs.dir="$dir" \
    -cp "$cp" kafka.Kafka "$dir/server.properties" >"$dir/stdout.log" 2>&1 &
  echo $! > "$dir/pid"
  for _ in $(seq 1 240); do
    if kcat -b "127.0.0.1:$port" "$@" -L -m 2 2>/dev/null | grep -q "1 brokers"; then return 0; fi
    if ! alive "$(cat "$dir/pid")"; then
      tail -50 "$dir/stdout.log" >&2; echo "kafka in $dir died" >&2; return 1
    fi
    sleep 0.5
  done
  echo "kafka in $dir did not answer metadata requests in 120 s; see $dir/server.log" >&2
  return 1
}

# kafka_kill DIR: SIGTERM, up to 30 s for a clean shutdown, then SIGKILL.
kafka_kill() {
  local dir="$1"
  [[ -f "$dir/pid" ]] || return 0
  local pid; pid=$(cat "$dir/pid")
  if alive "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 60); do alive "$pid" || break; sleep 0.5; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$dir/pid"
}
