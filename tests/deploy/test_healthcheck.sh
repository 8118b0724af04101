#!/usr/bin/env bash
# deploy/docker/healthcheck.sh against a stand-in admin endpoint: 200 passes;
# 503, a refused connection and a server that never answers fail.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
need python3 python3
make_tmp
check=$REPO/deploy/docker/healthcheck.sh

# Starts a server on a free loopback port answering /healthz with $1 ("hang":
# accept and never answer) and stores its port in the variable named $2.
# Killed at exit.
pids=()
p200='' p503='' phang=''
serve() {
  local mode=$1 portfile=$tmp/port.$1
  python3 - "$mode" "$portfile" >/dev/null 2>&1 <<'PY' &
import http.server, sys, time
mode, portfile = sys.argv[1], sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if mode == "hang":
            time.sleep(30)
            return
        code = int(mode) if self.path == "/healthz" else 404
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
open(portfile + ".tmp", "w").write(str(s.server_address[1]))
import os; os.rename(portfile + ".tmp", portfile)
s.serve_forever()
PY
  pids+=($!)
  for _ in $(seq 1 100); do [[ -f $portfile ]] && break; sleep 0.05; done
  [[ -f $portfile ]] || fail "stand-in server ($mode) did not start"
  printf -v "$2" '%s' "$(cat "$portfile")"
}
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$tmp"' EXIT

# Runs the health check with a clean environment plus NAME=VALUE words.
hc() {
  env -i PATH=/usr/bin:/bin CONFIG_FILE="$tmp/etc/walrelay.properties" \
    RENDERED_CONFIG_FILE="$tmp/run/walrelay.properties" HEALTHCHECK_TIMEOUT=2 "$@" bash "$check"
}

serve 200 p200
hc WALRELAY_ADMIN_LISTEN="127.0.0.1:$p200" || fail "200 reported unhealthy"
ok "200 -> healthy"
hc WALRELAY_ADMIN_LISTEN="0.0.0.0:$p200" || fail "wildcard host not mapped to loopback"
ok "0.0.0.0 -> loopback"

serve 503 p503
! hc WALRELAY_ADMIN_LISTEN="127.0.0.1:$p503" 2>/dev/null || fail "503 reported healthy"
ok "503 -> unhealthy"

free=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
! hc WALRELAY_ADMIN_LISTEN="127.0.0.1:$free" 2>/dev/null || fail "refused connection reported healthy"
ok "refused -> unhealthy"

serve hang phang
start=$SECONDS
! hc WALRELAY_ADMIN_LISTEN="127.0.0.1:$phang" 2>/dev/null || fail "silent server reported healthy"
((SECONDS - start < 10)) || fail "health check did not time out"
ok "no answer -> unhealthy within the timeout"

# admin.listen from the mounted file, then from the rendered one.
mkdir -p "$tmp/etc" "$tmp/run"
printf '# comment\nadmin.listen = 0.0.0.0:%s\n' "$p200" > "$tmp/etc/walrelay.properties"
hc || fail "admin.listen not read from the mounted file"
ok "port from the mounted file"
rm "$tmp/etc/walrelay.properties"
printf 'admin.listen=0.0.0.0:%s\n' "$p503" > "$tmp/run/walrelay.properties"
! hc 2>/dev/null || fail "admin.listen not read from the rendered file"
printf 'admin.listen=0.0.0.0:%s\n' "$p200" > "$tmp/run/walrelay.properties"
hc || fail "admin.listen not read from the rendered file"
ok "port from the rendered file"

# With a real binary: the script passes against walrelay's own /healthz while
# it is still trying to connect (nothing reachable), and /readyz says why not.
if [[ -n ${WALRELAY_DEPLOY_BINARY:-} ]]; then
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  env -i PATH=/usr/bin:/bin WALRELAY_DATABASE_HOSTNAME=127.0.0.1 WALRELAY_DATABASE_PORT=1 \
    WALRELAY_KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:1 WALRELAY_ADMIN_LISTEN="127.0.0.1:$port" \
    "$WALRELAY_DEPLOY_BINARY" --config /dev/null >"$tmp/walrelay.log" 2>&1 &
  pids+=($!)
  healthy=0
  for _ in $(seq 1 50); do
    if hc WALRELAY_ADMIN_LISTEN="0.0.0.0:$port" 2>/dev/null; then healthy=1; break; fi
    sleep 0.1
  done
  ((healthy)) || fail "healthcheck against the real walrelay failed: $(tail -5 "$tmp/walrelay.log")"
  ok "real walrelay /healthz"
  # shellcheck disable=SC2016  # expanded by the inner bash
  ready=$(timeout 5 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"; printf "GET /readyz HTTP/1.0\r\n\r\n" >&3; cat <&3' _ "$port" || true)
  grep -q '^HTTP/1.[01] 503' <<<"$ready" || fail "/readyz while nothing is reachable: $ready"
  ok "real walrelay /readyz 503: $(tail -n 1 <<<"$ready")"
fi
