#!/usr/bin/env bash
# NATS's own benchmark tool, `nats bench` (natscli, built once from the Go
# module proxy into the cache), publishing what walrelay's sinks section
# publishes: one client, asynchronous JetStream publishes of ~220-byte
# messages with a message id (deduplication, as walrelay's Nats-Msg-Id), up to
# 4096 awaiting their PubAck (walrelay's sink.nats-jetstream.max.pending), to a
# file-backed stream. Prints the tool's summary line: JetStream's own ceiling
# for that kind of publishing on this machine.
#
#   bench/nats_bench.sh NATS_URL [messages]     (default 300000)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/lib.sh
source "$here/../scripts/lib.sh"
url=${1:?usage: $0 NATS_URL [messages]}
messages=${2:-300000}
version=v0.5.1
bin="$CACHE_ROOT/natscli-$version/nats"
if [[ ! -x $bin ]]; then
  echo "nats_bench: building natscli $version from the Go module proxy" >&2
  GOBIN="$(dirname "$bin")" go install "github.com/nats-io/natscli/nats@$version" >&2
fi
stream="natsbench_$$"
"$bin" -s "$url" bench js pub async "$stream.subj" --stream "$stream" --create --storage file --dedup \
  --batch 4096 --size 220 --msgs "$messages" --no-progress 2>&1 | grep -E "stats:"
"$bin" -s "$url" stream rm -f "$stream" >/dev/null 2>&1 || true
