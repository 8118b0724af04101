#!/usr/bin/env bash
# Container entry point: makes sure walrelay has a configuration file, then
# execs it so that it is PID 1 and receives SIGTERM itself.
#
#   - If $CONFIG_FILE (default /etc/walrelay/walrelay.properties) exists, it is
#     used as it is: mount a ConfigMap or a file there.
#   - Otherwise a file is rendered at $RENDERED_CONFIG_FILE (default
#     /tmp/walrelay/walrelay.properties) from the WALRELAY_* variables, so that
#     the configuration in use can be read inside the container. walrelay reads
#     WALRELAY_* itself and they win over the file, so the file is only a
#     record: secrets and values a properties line cannot hold as they are
#     (line breaks, leading or trailing blanks, backslashes) are left to the
#     environment and appear as a comment. With no WALRELAY_* at all the file
#     holds only admin.listen, which is valid: every other key has a default.
#   - Arguments starting with "-" are passed to walrelay (e.g. --check); any
#     other first argument is run instead of walrelay (e.g. bash).
#
# The variables of this script deliberately do not start with WALRELAY_:
# walrelay treats those as configuration keys.
set -euo pipefail

config_file=${CONFIG_FILE:-/etc/walrelay/walrelay.properties}
rendered_file=${RENDERED_CONFIG_FILE:-/tmp/walrelay/walrelay.properties}

if [[ $# -gt 0 && $1 != -* ]]; then
  exec "$@"
fi

# Prints the configuration key of a WALRELAY_* variable name: prefix removed,
# lower case, underscores to dots (WALRELAY_KAFKA_BOOTSTRAP_SERVERS ->
# kafka.bootstrap.servers).
key_of() {
  local name=${1#WALRELAY_}
  name=${name,,}
  printf '%s' "${name//_/.}"
}

# True when a key's value must never be written to a file.
is_secret() {
  case $1 in
    *password*|*secret*|*token*|*.key.pem|*sasl.jaas.config|*sasl.oauthbearer.config) return 0 ;;
    *) return 1 ;;
  esac
}

# True when a value survives a `key=value` line unchanged.
is_plain() {
  local v=$1
  [[ $v != *$'\n'* && $v != *$'\r'* && $v != *\\* ]] || return 1
  [[ $v == "${v#[[:space:]]}" && $v == "${v%[[:space:]]}" ]] || return 1
}

render() {
  local out=$1 tmp name key value
  if ! mkdir -p "$(dirname "$out")" 2>/dev/null || ! tmp=$(mktemp "$out.XXXXXX" 2>/dev/null); then
    echo "walrelay-entrypoint: could not write $out: directory not writable;" \
      "mount a configuration file at $config_file or a writable volume at $(dirname "$out")" >&2
    exit 2
  fi
  {
    echo "# Rendered by the container entry point from WALRELAY_* variables at $(date -u +%Y-%m-%dT%H:%M:%SZ)."
    echo "# walrelay reads the same variables and they take precedence over this file."
    local have_listen=0
    while IFS= read -r name; do
      [[ $name == WALRELAY_* ]] || continue
      key=$(key_of "$name")
      value=${!name}
      [[ $key == admin.listen ]] && have_listen=1
      if is_secret "$key"; then
        echo "# $key: set from \$$name (not written here)"
      elif ! is_plain "$value"; then
        echo "# $key: set from \$$name (value not representable on one line)"
      else
        printf '%s=%s\n' "$key" "$value"
      fi
    done < <(compgen -e | LC_ALL=C sort)
    if ((have_listen == 0)); then
      echo "# the admin endpoint listens on every interface inside the container"
      echo "admin.listen=0.0.0.0:8080"
    fi
  } > "$tmp"
  chmod 0600 "$tmp"
  mv "$tmp" "$out"
}

if [[ -f $config_file ]]; then
  use=$config_file
else
  render "$rendered_file"
  use=$rendered_file
fi

exec walrelay --config "$use" "$@"
