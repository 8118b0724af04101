#!/usr/bin/env bash
# walrelay against pg_recvlogical (a reference client reading the same WAL), Debezium's
# embedded engine and a polling relay, on the same PostgreSQL 15, Kafka and
# workload; walrelay on librdkafka 2.8.0 (the default build) beside 2.0.2
# (Debian 12's) and the broker's own exactly-once floor; the decoder's
# micro-benchmark. See docs/benchmarks.md.
#
#   bench/run.sh            full run (under an hour on 2 cores): one dated folder bench/results/<UTC date>/
#                           (every run, the machine, every version, each binary's commit and build type:
#                           bench/provenance.py), bench/results/latest pointing to it,
#                           plots in docs/img/, and docs/benchmarks.md's tables regenerated (bench/report.py)
#   bench/run.sh --quick    20,000 events, walrelay + pg_recvlogical + polling relay; fails unless every
#                           event arrived (CTest `bench_quick`, label bench). Own services, stopped after.
#
# Extra arguments go to bench/bench.py (e.g. --repeats 5, --only throughput,latency,
# --contenders walrelay,pg_recvlogical, --only txn-floor for the broker's exactly-once floor); a run
# with --only writes to a scratch folder unless WALRELAY_BENCH_OUT is set. Environment:
#   WALRELAY_BIN        walrelay binary to measure (default: build a Release one in build-bench/)
#   WALRELAY_RUN_DIR    services' run directory (full run default /tmp/wr-bench; --quick always a fresh one)
#   WALRELAY_BENCH_OUT  results directory (full default bench/results/<UTC date>; --quick and --only
#                       default <run dir>/results)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
quick=0
partial=0
args=()
for a in "$@"; do
  if [[ $a == --quick ]]; then quick=1; else args+=("$a"); fi
  [[ $a == --only* ]] && partial=1
done
CACHE_ROOT="${WALRELAY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/walrelay}"

if ((quick)); then
  export WALRELAY_RUN_DIR
  WALRELAY_RUN_DIR=$(mktemp -d /tmp/wr-bench-quick.XXXXXX)
  out="${WALRELAY_BENCH_OUT:-$WALRELAY_RUN_DIR/results}"
else
  export WALRELAY_RUN_DIR="${WALRELAY_RUN_DIR:-/tmp/wr-bench}"
  if ((partial)); then out="${WALRELAY_BENCH_OUT:-$WALRELAY_RUN_DIR/results}"
  else out="${WALRELAY_BENCH_OUT:-$here/results/$(date -u +%Y-%m-%d)}"; fi
fi
services="$repo/scripts/services.sh"
started=0
cleanup() {
  if ((started)); then "$services" stop >/dev/null 2>&1 || true; fi
  if ((quick)); then rm -rf "$WALRELAY_RUN_DIR"; fi
}
trap cleanup EXIT
"$services" status >/dev/null 2>&1 || started=1

# walrelay: the given binary or a Release build of this checkout (on
# librdkafka 2.8.0, built once per machine by scripts/librdkafka.sh); for a
# full run also the same code on Debian 12's librdkafka 2.0.2, and the
# decoder's micro-benchmark.
bin="${WALRELAY_BIN:-}"
variants=()
if ((!quick)); then
  "$repo/scripts/librdkafka.sh" >/dev/null
  if [[ -z $bin ]]; then
    echo "==> building walrelay (Release, librdkafka 2.8.0) in build-bench/" >&2
    cmake -S "$repo" -B "$repo/build-bench" -G Ninja -DCMAKE_BUILD_TYPE=Release -DWALRELAY_TESTS=OFF >/dev/null
    ninja -C "$repo/build-bench" walrelay >/dev/null
    bin="$repo/build-bench/walrelay"
  fi
  if ((!partial)) || [[ " ${args[*]} " == *librdkafka* || " ${args[*]} " == *eos-throughput* ]]; then
    echo "==> building walrelay (Release, Debian 12's librdkafka 2.0.2) in build-bench-rdkafka-2.0.2/" >&2
    cmake -S "$repo" -B "$repo/build-bench-rdkafka-2.0.2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DWALRELAY_TESTS=OFF \
      -DWALRELAY_BENCH=OFF -DWALRELAY_RDKAFKA_PREFIX=system >/dev/null
    ninja -C "$repo/build-bench-rdkafka-2.0.2" walrelay >/dev/null
    variants=(--variant "librdkafka 2.8.0=$bin" --variant "librdkafka 2.0.2=$repo/build-bench-rdkafka-2.0.2/walrelay")
  fi
elif [[ -z $bin ]]; then
  echo "==> building walrelay (Release) in build-bench/" >&2
  cmake -S "$repo" -B "$repo/build-bench" -G Ninja -DCMAKE_BUILD_TYPE=Release -DWALRELAY_TESTS=OFF >/dev/null
  ninja -C "$repo/build-bench" walrelay >/dev/null
  bin="$repo/build-bench/walrelay"
fi

# Python for the driver, the polling relay and the plots
venv="${WALRELAY_BENCH_VENV:-$CACHE_ROOT/bench-venv}"
pkgs=("psycopg[binary]>=3.1" "confluent-kafka>=2.3")
((quick)) || pkgs+=("matplotlib>=3.7")
if [[ ! -x $venv/bin/python ]]; then python3 -m venv "$venv"; fi
if ! "$venv/bin/python" -c 'import psycopg, confluent_kafka' 2>/dev/null \
   || { ((!quick)) && ! "$venv/bin/python" -c 'import matplotlib' 2>/dev/null; }; then
  echo "==> installing ${pkgs[*]} into $venv" >&2
  "$venv/bin/pip" install -q "${pkgs[@]}" >&2
fi

dbz=()
if ((!quick)); then
  echo "==> Debezium embedded engine (Maven Central, cached)" >&2
  dbz=(--debezium-dir "$("$here/debezium/jars.sh")")
fi

work="$WALRELAY_RUN_DIR/bench-work"
mkdir -p "$work" "$out"
touch "$work/.started"
if ((!quick && !partial)); then
  # The decoder alone, before any service starts: one core, the machine quiet.
  echo "==> decoder micro-benchmark" >&2
  cmake -S "$repo" -B "$repo/build-bench" -G Ninja -DCMAKE_BUILD_TYPE=Release -DWALRELAY_TESTS=OFF >/dev/null
  ninja -C "$repo/build-bench" decoder_bench >/dev/null
  # Google Benchmark records the date, host and CPUs; the rest of what every
  # results file records (bench/provenance.py) goes into its context.
  build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$repo/build-bench/CMakeCache.txt")
  context="build_type=$build_type,walrelay_commit=$(git -C "$repo" describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)"
  context+=",uname=$(uname -a),cpu_model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
  taskset -c 1 "$repo/build-bench/bench/decoder_bench" --benchmark_repetitions=5 \
    --benchmark_report_aggregates_only=true --benchmark_out="$out/decoder.json" --benchmark_out_format=json \
    --benchmark_context="${context//,,/,}" >&2
fi
echo "==> services in $WALRELAY_RUN_DIR" >&2
"$services" start 2>/dev/null
# shellcheck disable=SC1090
source <("$services" env)
registry=()
if ((!quick)) && { ((!partial)) || [[ " ${args[*]} " == *formats* ]]; }; then
  # The formats section: Apicurio Registry, its Confluent-compatible API.
  "$services" start registry 2>/dev/null
  # shellcheck disable=SC1090
  source <("$services" env)
  registry=(--registry "$WALRELAY_TEST_REGISTRY/apis/ccompat/v7")
fi
brokers=()
if ((!quick)) && { ((!partial)) || [[ " ${args[*]} " == *sinks* ]]; }; then
  # The sinks section: NATS JetStream and RabbitMQ beside Kafka.
  "$services" start nats 2>/dev/null
  "$services" start rabbitmq 2>/dev/null
  "$services" start redis 2>/dev/null
  "$services" start http 2>/dev/null
  # ElasticMQ in memory: persisting each call to H2 bounds it far below what
  # walrelay sends (about 280 events/s, bench/results/2026-12-05-sinks-http-sqs).
  ELASTICMQ_STORAGE=memory "$services" start sqs 2>/dev/null
  # shellcheck disable=SC1090
  source <("$services" env)
  brokers=(--nats "$WALRELAY_TEST_NATS" --rabbitmq "$WALRELAY_TEST_RABBITMQ" --redis "$WALRELAY_TEST_REDIS"
           --http "$WALRELAY_TEST_HTTP" --sqs "$WALRELAY_TEST_SQS")
fi
kafka_version=$(basename "$("$repo/scripts/kafka-jars.sh")")
mode=()
((quick)) && mode=(--quick)
"$venv/bin/python" "$here/bench.py" "${mode[@]}" --pgport "$WALRELAY_TEST_PGPORT" --kafka "$WALRELAY_TEST_KAFKA" \
  --walrelay "$bin" --pg-recvlogical "${PG_BIN:-/usr/lib/postgresql/15/bin}/pg_recvlogical" \
  --kafka-pid "$(cat "$WALRELAY_RUN_DIR/kafka/pid")" --kafka-version "${kafka_version#kafka-}" \
  --out "$out" --work "$work" "${dbz[@]}" "${variants[@]}" "${registry[@]}" "${brokers[@]}" "${args[@]}"
# Plots from what this run wrote. A full run into bench/results/<date> is the
# published one: its plots go to docs/img, bench/results/latest points to it
# and docs/benchmarks.md's generated part is written from it; anything else
# keeps its plots beside its results.
if ((!quick)); then
  img="$out"
  published=0
  if ((!partial)) && [[ $(dirname "$out") -ef $here/results ]]; then published=1; img="$repo/docs/img"; fi
  for f in "$out"/*.json; do
    [[ $(basename "$f") == decoder.json ]] && continue
    if [[ $f -nt $work/.started ]]; then "$venv/bin/python" "$here/plot.py" "$f" "$img"; fi
  done
  if ((published)); then
    ln -sfn "$(basename "$out")" "$here/results/latest"
    "$venv/bin/python" "$here/report.py" --update "$repo/docs/benchmarks.md" --update "$repo/README.md" "$out"
  fi
fi
echo "==> results in $out" >&2
