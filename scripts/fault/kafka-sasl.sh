#!/usr/bin/env bash
# A second, throwaway single-node Kafka (KRaft) whose client listener requires
# SASL_PLAINTEXT with the PLAIN mechanism, for the security fault test. Same
# jars as scripts/services.sh; its own directory, ports and data.
#
#   scripts/fault/kafka-sasl.sh start DIR USER PASSWORD   prints the bootstrap address
#   scripts/fault/kafka-sasl.sh stop DIR
#   scripts/fault/kafka-sasl.sh acl BOOTSTRAP ADMIN_PASSWORD ARGS...
#       Kafka's own AclCommand (kafka-acls.sh) as the super user, with ARGS
#       (--add/--remove ...): librdkafka 2.0's admin API has no
#       transactional.id resource.
#
# With KAFKA_SASL_ADMIN_PASSWORD set, the super user `admin` has that
# password (else a random one); with KAFKA_SASL_AUTHORIZER=1 the broker runs
# KRaft's StandardAuthorizer and USER may do only what ACLs allow (the
# controller listener's ANONYMOUS principal is a super user: the broker is
# its own controller).
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
    admin_password=${KAFKA_SASL_ADMIN_PASSWORD:-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')}
    authorizer=""
    if [[ ${KAFKA_SASL_AUTHORIZER:-} == 1 ]]; then
      authorizer="authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:admin;User:ANONYMOUS
allow.everyone.if.no.acl.found=false"
    fi
    kafka_configure "$dir" "$port" "$cport" SASL_PLAINTEXT "num.partitions=1
$authorizer
sasl.enabled.mechanisms=PLAIN
sasl.mechanism.inter.broker.protocol=PLAIN
listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username=\"admin\" password=\"$admin_password\" user_admin=\"$admin_password\" user_$user=\"$password\";"
    kafka_launch "$dir" "-Xms128m -Xmx512m" "$port" -X security.protocol=SASL_PLAINTEXT -X sasl.mechanism=PLAIN \
      -X sasl.username="$user" -X sasl.password="$password"
    echo "127.0.0.1:$port" ;;
  stop) kafka_kill "$dir" ;;
  acl)
    admin_password="${3:?admin password}"; shift 3
    conf=$(mktemp)
    trap 'rm -f "$conf"' EXIT
    printf '%s\n' "security.protocol=SASL_PLAINTEXT" "sasl.mechanism=PLAIN" \
      "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username=\"admin\" password=\"$admin_password\";" \
      > "$conf"
    java -cp "$(kafka_classpath)" org.apache.kafka.tools.AclCommand --bootstrap-server "$dir" --command-config "$conf" \
      "$@" >/dev/null ;;
  *) echo "usage: $0 start DIR USER PASSWORD | stop DIR | acl BOOTSTRAP ADMIN_PASSWORD ARGS..." >&2; exit 2 ;;
esac
