#!/usr/bin/env bash
# Fetches Debezium's embedded engine, PostgreSQL connector and the Kafka
# client from Maven Central by coordinates into a cache folder keyed by
# version (like scripts/kafka-jars.sh), compiles DebeziumBench.java against
# them and prints the folder (libs/ and classes/). Nothing lands in the repo.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
DEBEZIUM_VERSION="${DEBEZIUM_VERSION:-3.6.1.Final}"
KAFKA_CLIENTS_VERSION="${KAFKA_CLIENTS_VERSION:-4.3.0}"
CACHE_ROOT="${WALRELAY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/walrelay}"
dir="$CACHE_ROOT/debezium-$DEBEZIUM_VERSION-kafka-$KAFKA_CLIENTS_VERSION"
if [[ ! -f "$dir/.complete" ]]; then
  mkdir -p "$dir/libs"
  work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
  cat > "$work/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>walrelay</groupId><artifactId>debezium-bench-jars</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>io.debezium</groupId><artifactId>debezium-api</artifactId><version>$DEBEZIUM_VERSION</version></dependency>
    <dependency><groupId>io.debezium</groupId><artifactId>debezium-embedded</artifactId><version>$DEBEZIUM_VERSION</version></dependency>
    <dependency><groupId>io.debezium</groupId><artifactId>debezium-connector-postgres</artifactId><version>$DEBEZIUM_VERSION</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-clients</artifactId><version>$KAFKA_CLIENTS_VERSION</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-simple</artifactId><version>1.7.36</version></dependency>
  </dependencies>
</project>
POM
  ( cd "$work" && mvn -q -B dependency:copy-dependencies -DoutputDirectory="$dir/libs" -DincludeScope=runtime >&2 )
  touch "$dir/.complete"
fi
# Recompile when the source changed.
src="$here/DebeziumBench.java"
if [[ -f "$src" ]] && { [[ ! -f "$dir/classes/.stamp" ]] || [[ "$src" -nt "$dir/classes/.stamp" ]]; }; then
  rm -rf "$dir/classes"; mkdir -p "$dir/classes"
  javac -nowarn -d "$dir/classes" -cp "$dir/libs/*" "$src" >&2
  touch "$dir/classes/.stamp"
fi
echo "$dir"
