#!/usr/bin/env bash
# RabbitMQ's own benchmark tool, PerfTest (com.rabbitmq:perf-test from Maven
# Central, cached), publishing what walrelay's sinks section publishes: one
# producer, persistent ~220-byte messages to a durable queue through a topic
# exchange, publisher confirms with up to 4096 unconfirmed (walrelay's
# sink.rabbitmq.max.pending), no consumer; each message mandatory and with
# two headers as walrelay's carry (the event's id and its key). Prints
# PerfTest's summary: the broker's own ceiling for that kind of publishing
# on this machine. (The headers matter: without them the broker spends about
# a third less per message, bench/results/2026-12-06-rabbitmq-headers.)
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
  --producers 1 --consumers 0 --flag persistent --flag mandatory --confirm 4096 --size 220 \
  --message-properties "id=0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0,key=customer-1234" --pmessages "$messages" \
  --time 120 2>&1 | grep -E "sending rate avg|sent:|summary|confirmed" | tail -5
