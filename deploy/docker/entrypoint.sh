#!/usr/bin/env bash
# Container entry point: makes sure walrelay has a configuration file, then
# execs it so that it is PID 1 and receives SIGTERM itself.
#
#   - If $CONFIG_FILE (default /etc/walrelay/walrelay.properties) exists, it is
#     used as it is: mount a ConfigMap or a file there.
#   - Otherwise a file is rendered at $RENDERED_CONFIG_FILE (default
#     /tmp/walrelay/walrelay.properties) so that one exists and the settings
#     in use can be read inside the container. walrelay reads the WALRELAY_*
#     variables itself and they win over the file, so the file records them
#     as comments only (secrets masked): a comment can never fail to parse,
#     whereas a variable walrelay ignores (WALRELAY_CONFIG, test variables)
#     written as a key would be an unknown key. The one real line is
#     admin.listen=0.0.0.0:8080 unless WALRELAY_ADMIN_LISTEN is set: on
#     loopback the admin port could not be published. Every key but
#     kafka.bootstrap.servers has a default; without WALRELAY_KAFKA_BOOTSTRAP_SERVERS
#     walrelay exits 2 naming it.
#   - Arguments starting with "-" are passed to walrelay (e.g. --check); any
#     other first argument is run instead of walrelay (e.g. bash).
#
# The variables of this script deliberately do not start with WALRELAY_, the
# prefix of walrelay's own configuration variables.
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

# walrelay's one rule for showing a setting (shown_setting in src/config.cpp;
# tests/unit/config_test.cpp checks that the two agree on every key):
# True when a key's value must never be written (the words of
# secret_key_words()).
is_secret() {
  case $1 in
    *password*|*token*|*secret*|*sasl.jaas*|*ssl.key.pem*|*ssl_key*|*user.info*|*oauthbearer.config*|*seed*|*jwt*) return 0 ;;
    *) return 1 ;;
  esac
}

# Prints text with the user info of every URL in it masked (redact_url): from
# each :// to the last @ before the next ://.
redact_urls() {
  local rest=$1 out='' segment
  while [[ $rest == *'://'* ]]; do
    out+=${rest%%'://'*}'://'
    rest=${rest#*'://'}
    segment=${rest%%'://'*}
    if [[ $segment == *@* ]]; then
      out+='********'
      rest=@${rest#"${segment%@*}"@}
    fi
  done
  printf '%s' "$out$rest"
}

# Prints a setting's value as walrelay would show it.
shown_setting() {
  if is_secret "$1"; then
    [[ -z $2 ]] || printf '********'
  else
    redact_urls "$2"
  fi
}

render() {
  local out=$1 tmp name key value
  if ! mkdir -p "$(dirname "$out")" 2>/dev/null || ! tmp=$(mktemp "$out.XXXXXX" 2>/dev/null); then
    echo "walrelay-entrypoint: could not write $out: directory not writable;" \
      "mount a configuration file at $config_file or a writable volume at $(dirname "$out")" >&2
    exit 2
  fi
  {
    echo "# Rendered by the container entry point at $(date -u +%Y-%m-%dT%H:%M:%SZ)."
    echo "# walrelay reads these WALRELAY_* variables itself; they take precedence over this file."
    while IFS= read -r name; do
      [[ $name == WALRELAY_* ]] || continue
      key=$(key_of "$name")
      value=${!name}
      if is_secret "$key"; then
        echo "#   $name (${key}): ********"
      elif [[ $value == *$'\n'* || $value == *$'\r'* ]]; then
        echo "#   $name (${key}): (multi-line value)"
      else
        echo "#   $name (${key}): $(shown_setting "$key" "$value")"
      fi
    done < <(compgen -e | LC_ALL=C sort)
    if [[ -z ${WALRELAY_ADMIN_LISTEN:-} ]]; then
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
