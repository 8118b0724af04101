#!/usr/bin/env bash
# Measurement only: runs walrelay against the librdkafka that a release of
# PyPI's confluent-kafka wheel bundles, to see what a newer librdkafka than
# Debian 12's 2.0.2 changes (walrelay itself builds and ships against
# Debian's package). Prints the path of a wrapper to give as WALRELAY_BIN:
#
#   WALRELAY_BIN=$(bench/librdkafka-from-wheel.sh 2.16.1) bench/run.sh --only latency ...
#
# Arguments: the confluent-kafka version (default 2.16.1), the walrelay
# binary (default build-bench/walrelay).
set -euo pipefail
version="${1:-2.16.1}"
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=$(realpath "${2:-$repo/build-bench/walrelay}")
dir="${WALRELAY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/walrelay}/librdkafka-wheel-$version"
if [[ ! -e $dir/librdkafka.so.1 ]]; then
  mkdir -p "$dir/dl"
  pip=(python3 -m pip)
  if ! python3 -m pip --version >/dev/null 2>&1; then
    python3 -m venv "$dir/venv" && pip=("$dir/venv/bin/pip")
  fi
  "${pip[@]}" download -q --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
    --python-version 3.11 -d "$dir/dl" "confluent-kafka==$version" >&2
  lib=$(python3 - "$dir/dl" <<'PY'
import glob, sys, zipfile
whl = glob.glob(sys.argv[1] + "/confluent_kafka-*.whl")[0]
z = zipfile.ZipFile(whl)
name = next(n for n in z.namelist() if "/librdkafka" in n and ".so" in n)
out = sys.argv[1] + "/librdkafka.so.1"
open(out, "wb").write(z.read(name))
print(out)
PY
)
  mv "$lib" "$dir/librdkafka.so.1"
fi
cat > "$dir/walrelay" <<WRAP
#!/bin/sh
LD_LIBRARY_PATH='$dir' exec '$bin' "\$@"
WRAP
chmod +x "$dir/walrelay"
"$dir/walrelay" --version >&2
echo "$dir/walrelay"
