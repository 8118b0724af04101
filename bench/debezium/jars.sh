#!/usr/bin/env bash
# Fetches Debezium's embedded engine, PostgreSQL connector and the Kafka
# client from Maven Central by coordinates into a cache folder keyed by
# version (like scripts/kafka-jars.sh), compiles DebeziumBench.java against
# them and prints the folder (libs/ and classes/). Nothing lands in the repo.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/lib.sh
source "$here/../../scripts/lib.sh"
DEBEZIUM_VERSION="${DEBEZIUM_VERSION:-3.6.1.Final}"
KAFKA_CLIENTS_VERSION="${KAFKA_CLIENTS_VERSION:-4.3.0}"
dir="$CACHE_ROOT/debezium-$DEBEZIUM_VERSION-kafka-$KAFKA_CLIENTS_VERSION"
dep() { echo "    <dependency><groupId>$1</groupId><artifactId>$2</artifactId><version>$3</version></dependency>"; }
maven_fetch "$dir" debezium-bench-jars "$(
  dep io.debezium debezium-api "$DEBEZIUM_VERSION"
  dep io.debezium debezium-embedded "$DEBEZIUM_VERSION"
  dep io.debezium debezium-connector-postgres "$DEBEZIUM_VERSION"
  dep org.apache.kafka kafka-clients "$KAFKA_CLIENTS_VERSION"
  dep org.slf4j slf4j-simple 1.7.36
)"
# Recompile when the source changed.
src="$here/DebeziumBench.java"
if [[ -f "$src" ]] && { [[ ! -f "$dir/classes/.stamp" ]] || [[ "$src" -nt "$dir/classes/.stamp" ]]; }; then
  rm -rf "$dir/classes"; mkdir -p "$dir/classes"
  javac -nowarn -d "$dir/classes" -cp "$dir/libs/*" "$src" >&2
  touch "$dir/classes/.stamp"
fi
echo "$dir"
