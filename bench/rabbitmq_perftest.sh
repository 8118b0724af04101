#!/usr/bin/env bash
# RabbitMQ's own benchmark tool, PerfTest (com.rabbitmq:perf-test from Maven
# Central, cached), publishing what walrelay's sinks section publishes: one
# producer, persistent ~220-byte messages to a durable queue through a topic
# exchange, publisher confirms with up to 4096 unconfirmed (walrelay's
# sink.rabbitmq.max.pending), no consumer. Prints PerfTest's summary: the
# broker's own ceiling for that kind of publishing on this machine.
#
#   bench/rabbitmq_perftest.sh HOST:PORT [messages]     (default 300000)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/lib.sh
source "$here/../scripts/lib.sh"
address=${1:?usage: $0 HOST:PORT [messages]}
messages=${2:-300000}
version=2.22.1
dir="$CACHE_ROOT/rabbitmq-perf-test-$version"
maven_fetch "$dir" perf-test "    <dependency><groupId>com.rabbitmq</groupId><artifactId>perf-test</artifactId><version>$version</version></dependency>"
queue="perftest_$$"
java -cp "$dir/libs/*" com.rabbitmq.perf.PerfTest --uri "amqp://guest:guest@$address" \
  --exchange "$queue" --type topic --routing-key "$queue.Order" --queue "$queue" --auto-delete true \
  --producers 1 --consumers 0 --flag persistent --confirm 4096 --size 220 --pmessages "$messages" \
  --time 120 2>&1 | grep -E "sending rate avg|sent:|summary|confirmed" | tail -5
