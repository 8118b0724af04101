#!/usr/bin/env bash
# Fetches the Apache Kafka broker and its dependencies from Maven Central by
# coordinates into a cache folder keyed by version; prints that folder.
# Idempotent: a complete cache is reused without touching the network.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
KAFKA_VERSION="${KAFKA_VERSION:-4.1.1}"
dir="$CACHE_ROOT/kafka-$KAFKA_VERSION"
dep() { echo "    <dependency><groupId>$1</groupId><artifactId>$2</artifactId><version>$3</version></dependency>"; }
maven_fetch "$dir" kafka-broker-jars "$(
  dep org.apache.kafka kafka_2.13 "$KAFKA_VERSION"
  dep org.apache.kafka kafka-server "$KAFKA_VERSION"
  dep org.apache.kafka kafka-tools "$KAFKA_VERSION"
  dep org.apache.kafka kafka-storage "$KAFKA_VERSION"
  dep org.slf4j slf4j-reload4j 1.7.36
)"
echo "$dir"
