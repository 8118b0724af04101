#!/usr/bin/env bash
# Builds the pgoutput libFuzzer target with clang++-14 (ASan + UBSan) and runs
# it for N seconds (default 60) on a corpus seeded from tests/golden/*.hex.
# Exits non-zero if the fuzzer finds a crash, leak or sanitizer error.
#
#   tests/fuzz/run.sh [seconds]
#
# Environment: CXX (default clang++-14), FUZZ_DIR (build and corpus directory,
# default /tmp/pgoutput-fuzz-<hash of this checkout>), FUZZ_JOBS (fork mode
# with that many workers when > 1; default one process).
set -euo pipefail

seconds="${1:-60}"
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
CXX="${CXX:-clang++-14}"
FUZZ_DIR="${FUZZ_DIR:-/tmp/pgoutput-fuzz-$(echo "$repo" | md5sum | cut -c1-8)}"
bin="$FUZZ_DIR/fuzz_decoder"
corpus="$FUZZ_DIR/corpus"
mkdir -p "$FUZZ_DIR" "$corpus" "$FUZZ_DIR/artifacts"

command -v "$CXX" >/dev/null || { echo "could not build the fuzzer: $CXX not found" >&2; exit 1; }

# Build (a tiny separate build: two translation units).
"$CXX" -std=c++20 -g -O1 -fno-omit-frame-pointer \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  -I"$repo/decoder/include" \
  "$here/fuzz_decoder.cpp" "$repo/decoder/src/pgoutput.cpp" -o "$bin.new"
mv "$bin.new" "$bin"

# Seed: each golden message, prefixed with the mode byte of its case (see
# fuzz_decoder.cpp). Messages inside a stream get the in-stream bit. Values
# above 64 kB are left out to keep the fuzzer fast.
python3 - "$repo/tests/golden" "$corpus" <<'PY'
import hashlib, os, sys
golden, corpus = sys.argv[1], sys.argv[2]
for name in sorted(os.listdir(golden)):
    if not name.endswith(".hex"):
        continue
    proto = int(name[1])
    in_stream = False
    seq = bytearray([64 | (proto - 1)])
    with open(os.path.join(golden, name)) as f:
        for line in f:
            msg = bytes.fromhex(line.strip())
            if not msg or len(msg) > 65536:
                continue
            mode = (proto - 1) | (4 if in_stream else 0)
            for data in (bytes([mode]) + msg,
                         bytes([mode | 32]) + b"w" + bytes(24) + msg):
                path = os.path.join(corpus, "seed-" + hashlib.sha1(data).hexdigest())
                if not os.path.exists(path):
                    with open(path, "wb") as out:
                        out.write(data)
            if len(seq) + len(msg) < 8192:
                seq += len(msg).to_bytes(2, "big") + msg
            if msg[:1] == b"S":
                in_stream = True
            elif msg[:1] == b"E":
                in_stream = False
    with open(os.path.join(corpus, "seq-" + name[:-4]), "wb") as out:
        out.write(bytes(seq))
PY

echo "fuzzing for ${seconds}s with $(find "$corpus" -type f | wc -l) corpus inputs in $FUZZ_DIR"
cd "$FUZZ_DIR"
parallel=()
if [[ -n ${FUZZ_JOBS:-} && ${FUZZ_JOBS} -gt 1 ]]; then parallel=(-fork="$FUZZ_JOBS"); fi
"$bin" -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
  "${parallel[@]}" -print_final_stats=1 \
  -artifact_prefix="$FUZZ_DIR/artifacts/" "$corpus" 2>"$FUZZ_DIR/fuzz.log" || {
  rc=$?
  tail -60 "$FUZZ_DIR/fuzz.log" >&2
  echo "fuzzer failed (exit $rc); crashing inputs in $FUZZ_DIR/artifacts" >&2
  exit "$rc"
}
tail -15 "$FUZZ_DIR/fuzz.log"
