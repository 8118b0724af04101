#!/usr/bin/env bash
# Fetches the Apache Kafka broker and its dependencies from Maven Central by
# coordinates into a cache folder keyed by version; prints that folder.
# Idempotent: a complete cache is reused without touching the network.
set -euo pipefail
KAFKA_VERSION="${KAFKA_VERSION:-4.1.1}"
CACHE_ROOT="${WALRELAY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/walrelay}"
dir="$CACHE_ROOT/kafka-$KAFKA_VERSION"
if [[ -f "$dir/.complete" ]]; then echo "$dir"; exit 0; fi
mkdir -p "$dir/libs"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
cat > "$work/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>walrelay</groupId><artifactId>kafka-broker-jars</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-server</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-storage</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-reload4j</artifactId><version>1.7.36</version></dependency>
  </dependencies>
</project>
POM
( cd "$work" && mvn -q -B dependency:copy-dependencies -DoutputDirectory="$dir/libs" -DincludeScope=runtime >&2 )
touch "$dir/.complete"
echo "$dir"
