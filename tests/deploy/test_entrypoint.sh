#!/usr/bin/env bash
# deploy/docker/entrypoint.sh without Docker: a fake `walrelay` on PATH prints
# its arguments and the configuration file it was given.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
make_tmp
entry=$REPO/deploy/docker/entrypoint.sh

mkdir -p "$tmp/bin"
cat > "$tmp/bin/walrelay" <<'FAKE'
#!/usr/bin/env bash
echo "ARGS: $*"
while (($#)); do
  if [[ $1 == --config ]]; then echo "FILE: $2"; sed 's/^/CONF: /' "$2"; fi
  shift
done
FAKE
chmod +x "$tmp/bin/walrelay"

# Runs the entry point with a clean environment plus the given NAME=VALUE words.
run_entry() {
  env -i PATH="$tmp/bin:/usr/bin:/bin" HOME="$tmp" CONFIG_FILE="$tmp/etc/walrelay.properties" \
    RENDERED_CONFIG_FILE="$tmp/run/walrelay.properties" "$@"
}

# shellcheck disable=SC2016  # the ${routedByValue} is literal
# 1. No mounted file: one is rendered; the variables appear as comments only,
#    secrets masked; admin.listen defaults to every interface.
out=$(run_entry WALRELAY_DATABASE_HOSTNAME=db.internal WALRELAY_DATABASE_PASSWORD=s3cret-pw \
  WALRELAY_KAFKA_BOOTSTRAP_SERVERS=k1:9092,k2:9092 WALRELAY_KAFKA_SASL_PASSWORD=kafka-pw \
  WALRELAY_ADMIN_TOKEN=tok-123 WALRELAY_ROUTE_TOPIC_REPLACEMENT='events.${routedByValue}' \
  WALRELAY_VALUE_CONVERTER_BASIC_AUTH_USER_INFO=bob:basic-pw WALRELAY_ADMIN_REPLAY_TOKEN=replay-tok \
  WALRELAY_SINK_NATS_JETSTREAM_URL=nats://relay:nats/pw@nats1:4222,nats://nats2:4222 \
  "WALRELAY_LOG_LEVEL=$(printf 'info\nevil=1')" NOT_OURS=x \
  bash "$entry")
grep -qxF "ARGS: --config $tmp/run/walrelay.properties" <<<"$out" || fail "wrong arguments: $out"
ok "rendered file passed with --config"
for line in "CONF: #   WALRELAY_DATABASE_HOSTNAME (database.hostname): db.internal" \
            "CONF: #   WALRELAY_KAFKA_BOOTSTRAP_SERVERS (kafka.bootstrap.servers): k1:9092,k2:9092" \
            "CONF: #   WALRELAY_ROUTE_TOPIC_REPLACEMENT (route.topic.replacement): events.\${routedByValue}" \
            "CONF: #   WALRELAY_DATABASE_PASSWORD (database.password): ********" \
            "CONF: #   WALRELAY_KAFKA_SASL_PASSWORD (kafka.sasl.password): ********" \
            "CONF: #   WALRELAY_ADMIN_TOKEN (admin.token): ********" \
            "CONF: #   WALRELAY_ADMIN_REPLAY_TOKEN (admin.replay.token): ********" \
            "CONF: #   WALRELAY_VALUE_CONVERTER_BASIC_AUTH_USER_INFO (value.converter.basic.auth.user.info): ********" \
            "CONF: #   WALRELAY_SINK_NATS_JETSTREAM_URL (sink.nats.jetstream.url): nats://********@nats1:4222,nats://nats2:4222" \
            "CONF: #   WALRELAY_LOG_LEVEL (log.level): (multi-line value)" \
            "CONF: admin.listen=0.0.0.0:8080"; do
  grep -qxF -- "$line" <<<"$out" || fail "missing line: $line"$'\n'"$out"
done
ok "variables recorded as comments"
for secret in s3cret-pw kafka-pw tok-123 basic-pw bob: replay-tok nats/pw relay: evil NOT_OURS; do
  ! grep -qF "$secret" <<<"$out" || fail "$secret leaked into the rendered file"
done
ok "no secret, multi-line value or foreign variable written"
# The only key=value line is admin.listen; everything else is a comment.
keys=$(grep '^CONF: ' <<<"$out" | sed 's/^CONF: //' | grep -v '^#' || true)
[[ $keys == "admin.listen=0.0.0.0:8080" ]] || fail "unexpected key lines: $keys"
ok "only admin.listen is a key"
mode=$(stat -c %a "$tmp/run/walrelay.properties")
[[ $mode == 600 ]] || fail "rendered file mode $mode, want 600"
ok "rendered file is 0600"

# 2. WALRELAY_ADMIN_LISTEN set: no admin.listen line of its own.
out=$(run_entry WALRELAY_ADMIN_LISTEN=0.0.0.0:9000 bash "$entry")
! grep -q '^CONF: admin.listen=' <<<"$out" || fail "admin.listen rendered despite WALRELAY_ADMIN_LISTEN: $out"
ok "WALRELAY_ADMIN_LISTEN leaves admin.listen to the environment"

# 3. A mounted file is used as it is, nothing rendered; extra flags follow.
mkdir -p "$tmp/etc"
rm -rf "$tmp/run"
printf 'kafka.bootstrap.servers=broker:9092\n' > "$tmp/etc/walrelay.properties"
out=$(run_entry WALRELAY_DATABASE_HOSTNAME=ignored-here bash "$entry" --check)
grep -qxF "ARGS: --config $tmp/etc/walrelay.properties --check" <<<"$out" || fail "wrong arguments: $out"
grep -qxF "CONF: kafka.bootstrap.servers=broker:9092" <<<"$out" || fail "mounted file not used: $out"
[[ ! -e $tmp/run ]] || fail "rendered a file although one was mounted"
ok "mounted file used, --check passed through"

# 4. Another command instead of walrelay.
out=$(run_entry bash "$entry" echo hello)
[[ $out == hello ]] || fail "command not run: $out"
ok "non-flag arguments run a command"

# 5. Nowhere to render: exit 2 with a message naming the way out.
rm -f "$tmp/etc/walrelay.properties"
set +e
out=$(env -i PATH="$tmp/bin:/usr/bin:/bin" CONFIG_FILE="$tmp/etc/walrelay.properties" \
  RENDERED_CONFIG_FILE=/dev/null/walrelay/walrelay.properties bash "$entry" 2>&1)
rc=$?
set -e
[[ $rc == 2 ]] || fail "exit $rc, want 2: $out"
grep -qF "mount a configuration file at $tmp/etc/walrelay.properties" <<<"$out" || fail "message: $out"
ok "unwritable render directory: exit 2"

# 6. With a real binary: walrelay's own parser accepts a rendered file and the
#    variables win over it (--print-config connects to nothing).
if [[ -n ${WALRELAY_DEPLOY_BINARY:-} ]]; then
  mkdir -p "$tmp/real"
  ln -sf "$WALRELAY_DEPLOY_BINARY" "$tmp/real/walrelay"
  set +e
  out=$(env -i PATH="$tmp/real:/usr/bin:/bin" CONFIG_FILE="$tmp/etc/none" \
    RENDERED_CONFIG_FILE="$tmp/run2/walrelay.properties" WALRELAY_DATABASE_HOSTNAME=db.internal \
    WALRELAY_KAFKA_BOOTSTRAP_SERVERS=k1:9092 WALRELAY_DATABASE_PASSWORD=s3cret-pw WALRELAY_SOMETHING_UNKNOWN=1 \
    timeout 30 bash "$entry" --print-config 2>&1)
  rc=$?
  set -e
  [[ $rc == 0 ]] || fail "real walrelay --print-config on a rendered file exited $rc: $out"
  for line in database.hostname=db.internal kafka.bootstrap.servers=k1:9092 admin.listen=0.0.0.0:8080; do
    grep -qxF "$line" <<<"$out" || fail "walrelay --print-config lacks $line: $out"
  done
  ! grep -qF s3cret-pw <<<"$out" || fail "walrelay --print-config shows the password"
  ok "real walrelay accepts the rendered file"
fi
