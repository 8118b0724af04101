#!/usr/bin/env bash
# A second, throwaway single-node Kafka (KRaft) whose client listener requires
# SASL_PLAINTEXT with the PLAIN mechanism, for the security fault test. Same
# jars as scripts/services.sh; its own directory, ports and data.
#
#   scripts/fault/kafka-sasl.sh start DIR USER PASSWORD   prints the bootstrap address
#   scripts/fault/kafka-sasl.sh stop DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cmd="${1:-}"
dir="${2:?usage: $0 start|stop DIR [USER PASSWORD]}"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

case "$cmd" in
  start)
    user="${3:?user}"; password="${4:?password}"
    mkdir -p "$dir"
    port=$(free_port); cport=$(free_port)
    admin_password=$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
    cat > "$dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=SASL_PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=SASL_PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=SASL_PLAINTEXT
listener.security.protocol.map=SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT
sasl.enabled.mechanisms=PLAIN
sasl.mechanism.inter.broker.protocol=PLAIN
listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="$admin_password" user_admin="$admin_password" user_$user="$password";
log.dirs=$dir/data
num.partitions=1
auto.create.topics.enable=true
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
PROPS
    cat > "$dir/log4j.properties" <<LOG
log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File=$dir/server.log
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
LOG
    cp="$("$here/../kafka-jars.sh")/libs/*"
    cluster_id=$(java -cp "$cp" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -1)
    java -cp "$cp" "-Dlog4j.configuration=file:$dir/log4j.properties" kafka.tools.StorageTool format \
      -t "$cluster_id" -c "$dir/server.properties" >"$dir/format.log" 2>&1 || { cat "$dir/format.log" >&2; exit 1; }
    nohup java -Xms128m -Xmx512m -XX:+UseG1GC -Djava.awt.headless=true \
      "-Dlog4j.configuration=file:$dir/log4j.properties" -Dkafka.logs.dir="$dir" \
      -cp "$cp" kafka.Kafka "$dir/server.properties" >"$dir/stdout.log" 2>&1 &
    echo $! > "$dir/pid"
    for _ in $(seq 1 240); do
      if kcat -b "127.0.0.1:$port" -X security.protocol=SASL_PLAINTEXT -X sasl.mechanism=PLAIN \
           -X sasl.username="$user" -X sasl.password="$password" -L -m 2 2>/dev/null | grep -q "1 brokers"; then
        echo "127.0.0.1:$port"; exit 0
      fi
      kill -0 "$(cat "$dir/pid")" 2>/dev/null || { tail -40 "$dir/stdout.log" >&2; echo "kafka-sasl: broker died" >&2; exit 1; }
      sleep 0.5
    done
    echo "kafka-sasl: no answer in 120 s; see $dir/server.log" >&2; exit 1 ;;
  stop)
    [[ -f "$dir/pid" ]] || exit 0
    pid=$(cat "$dir/pid")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$dir/pid" ;;
  *) echo "usage: $0 start DIR USER PASSWORD | stop DIR" >&2; exit 2 ;;
esac
