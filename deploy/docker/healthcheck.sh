#!/usr/bin/env bash
# Container health check without curl: GET /healthz over bash's /dev/tcp.
# Exits 0 on HTTP 200, 1 otherwise (503 while a halted walrelay with halt.action=exit drains, no answer, refused; halted with halt.action=stay it is 200: alive).
#
# The port comes from admin.listen: $WALRELAY_ADMIN_LISTEN if set, else the
# configuration file the entry point uses, else 127.0.0.1:8080. A wildcard
# host (0.0.0.0, ::, empty) is reached over loopback. /healthz needs no token.
set -uo pipefail

config_file=${CONFIG_FILE:-/etc/walrelay/walrelay.properties}
rendered_file=${RENDERED_CONFIG_FILE:-/tmp/walrelay/walrelay.properties}
timeout_s=${HEALTHCHECK_TIMEOUT:-4}

# Prints the last admin.listen value of a properties file, if any.
listen_from_file() {
  [[ -r $1 ]] || return 0
  sed -n 's/^[[:space:]]*admin\.listen[[:space:]]*[=:][[:space:]]*//p' "$1" | tail -n 1 | tr -d '\r'
}

listen=${WALRELAY_ADMIN_LISTEN:-}
if [[ -z $listen ]]; then
  if [[ -f $config_file ]]; then listen=$(listen_from_file "$config_file")
  else listen=$(listen_from_file "$rendered_file"); fi
fi
listen=${listen:-127.0.0.1:8080}

port=${listen##*:}
host=${listen%:*}
host=${host#[}
host=${host%]}
case $host in
  ''|0.0.0.0|'*') host=127.0.0.1 ;;
  ::) host=::1 ;;
esac
if [[ ! $port =~ ^[0-9]+$ ]]; then
  echo "healthcheck: could not parse admin.listen '$listen'" >&2
  exit 1
fi

# Prints the status line of GET /healthz; bounded by timeout(1).
# shellcheck disable=SC2016  # expanded by the inner bash
status=$(timeout "$timeout_s" bash -c '
  exec 3<>"/dev/tcp/$1/$2" || exit 1
  printf "GET /healthz HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" "$1" >&3
  IFS= read -r line <&3 && printf "%s" "$line"
' healthcheck "$host" "$port" 2>/dev/null)

if [[ $status =~ ^HTTP/1\.[01]\ 200 ]]; then
  exit 0
fi
echo "healthcheck: GET http://$listen/healthz: ${status:-no answer}" >&2
exit 1
