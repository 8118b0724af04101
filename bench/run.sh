#!/usr/bin/env bash
# walrelay against pg_recvlogical (the walsender's ceiling), Debezium's
# embedded engine and a polling relay, on the same PostgreSQL 15, Kafka and
# workload. See docs/benchmarks.md.
#
#   bench/run.sh            full run (about an hour on 2 cores): results in bench/results/, plots in docs/img/
#   bench/run.sh --quick    20,000 events, walrelay + pg_recvlogical + polling relay; fails unless every
#                           event arrived (CTest `bench_quick`, label bench). Own services, stopped after.
#
# Extra arguments go to bench/bench.py (e.g. --repeats 5, --only throughput,latency,
# --contenders walrelay,pg_recvlogical, --only txn-floor for the broker's exactly-once floor). Environment:
#   WALRELAY_BIN        walrelay binary to measure (default: build a Release one in build-bench/)
#   WALRELAY_RUN_DIR    services' run directory (full run default /tmp/wr-bench; --quick always a fresh one)
#   WALRELAY_BENCH_OUT  results directory (full default bench/results; --quick default <run dir>/results)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
quick=0
args=()
for a in "$@"; do
  if [[ $a == --quick ]]; then quick=1; else args+=("$a"); fi
done
CACHE_ROOT="${WALRELAY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/walrelay}"

if ((quick)); then
  export WALRELAY_RUN_DIR
  WALRELAY_RUN_DIR=$(mktemp -d /tmp/wr-bench-quick.XXXXXX)
  out="${WALRELAY_BENCH_OUT:-$WALRELAY_RUN_DIR/results}"
else
  export WALRELAY_RUN_DIR="${WALRELAY_RUN_DIR:-/tmp/wr-bench}"
  out="${WALRELAY_BENCH_OUT:-$here/results}"
fi
services="$repo/scripts/services.sh"
started=0
cleanup() {
  if ((started)); then "$services" stop >/dev/null 2>&1 || true; fi
  if ((quick)); then rm -rf "$WALRELAY_RUN_DIR"; fi
}
trap cleanup EXIT
"$services" status >/dev/null 2>&1 || started=1

# walrelay: the given binary or a Release build of this checkout
bin="${WALRELAY_BIN:-}"
if [[ -z $bin ]]; then
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

echo "==> services in $WALRELAY_RUN_DIR" >&2
"$services" start 2>/dev/null
# shellcheck disable=SC1090
source <("$services" env)
work="$WALRELAY_RUN_DIR/bench-work"
mkdir -p "$work" "$out"
touch "$work/.started"
mode=()
((quick)) && mode=(--quick)
"$venv/bin/python" "$here/bench.py" "${mode[@]}" --pgport "$WALRELAY_TEST_PGPORT" --kafka "$WALRELAY_TEST_KAFKA" \
  --walrelay "$bin" --pg-recvlogical "${PG_BIN:-/usr/lib/postgresql/15/bin}/pg_recvlogical" \
  --kafka-pid "$(cat "$WALRELAY_RUN_DIR/kafka/pid")" --out "$out" --work "$work" "${dbz[@]}" "${args[@]}"
# Plots from what this run wrote: full.json (a full run) or a partial run's own
# file (--only sidecar writes sidecar.json); older results are left alone. Into
# docs/img for the published results (bench/results), else beside the results.
if ((!quick)); then
  img="$out"
  [[ $out -ef $here/results ]] && img="$repo/docs/img"
  for f in "$out"/*.json; do
    if [[ $f -nt $work/.started ]]; then "$venv/bin/python" "$here/plot.py" "$f" "$img"; fi
  done
fi
echo "==> results in $out" >&2
