#!/usr/bin/env bash
# Builds Toxiproxy's server (the TCP proxy the fault campaign injects
# latency, resets, stalls and outages with) from the Go module proxy into
# the cache; prints the binary's path. Idempotent: a built binary is reused
# without touching the network. Go is the machine's own (`go` on the PATH
# or /usr/local/go), else Debian's golang-go.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
TOXIPROXY_VERSION="${TOXIPROXY_VERSION:-v2.5.0}"
dir="$CACHE_ROOT/toxiproxy-$TOXIPROXY_VERSION"
bin="$dir/toxiproxy-server"
if [[ -x $bin ]]; then
  echo "$bin"
  exit 0
fi
PATH="$PATH:/usr/local/go/bin"
if ! command -v go >/dev/null; then
  echo "toxiproxy: installing golang-go" >&2
  sudo=""; [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends golang-go >&2
fi
echo "toxiproxy: building github.com/Shopify/toxiproxy/v2 $TOXIPROXY_VERSION into $dir" >&2
mkdir -p "$dir"
# The module cache beside the binary (read-only files: -modcacherw lets a
# later `rm -rf` of the cache work).
GOPATH="$dir/go" GOBIN="$dir/bin" GOFLAGS=-modcacherw go install \
  "github.com/Shopify/toxiproxy/v2/cmd/server@$TOXIPROXY_VERSION" >&2
mv "$dir/bin/server" "$bin.tmp.$$"
mv "$bin.tmp.$$" "$bin"
rm -rf "${dir:?}/bin" "${dir:?}/go"
echo "$bin"
