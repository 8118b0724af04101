#!/usr/bin/env bash
# A second, throwaway single-node Kafka (KRaft) whose client listener requires
# SASL_PLAINTEXT with the PLAIN mechanism, for the security fault test. Same
# jars as scripts/services.sh; its own directory, ports and data.
#
#   scripts/fault/kafka-sasl.sh start DIR USER PASSWORD   prints the bootstrap address
#   scripts/fault/kafka-sasl.sh stop DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/lib.sh
source "$here/../lib.sh"
cmd="${1:-}"
dir="${2:?usage: $0 start|stop DIR [USER PASSWORD]}"

case "$cmd" in
  start)
    user="${3:?user}"; password="${4:?password}"
    mkdir -p "$dir"
    port=$(free_port); cport=$(free_port)
    admin_password=$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
    kafka_configure "$dir" "$port" "$cport" SASL_PLAINTEXT "num.partitions=1
sasl.enabled.mechanisms=PLAIN
sasl.mechanism.inter.broker.protocol=PLAIN
listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username=\"admin\" password=\"$admin_password\" user_admin=\"$admin_password\" user_$user=\"$password\";"
    kafka_launch "$dir" "-Xms128m -Xmx512m" "$port" -X security.protocol=SASL_PLAINTEXT -X sasl.mechanism=PLAIN \
      -X sasl.username="$user" -X sasl.password="$password"
    echo "127.0.0.1:$port" ;;
  stop) kafka_kill "$dir" ;;
  *) echo "usage: $0 start DIR USER PASSWORD | stop DIR" >&2; exit 2 ;;
esac
