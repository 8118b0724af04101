#!/usr/bin/env bash
# Breaks walrelay's guarantees on purpose, one at a time, and shows that the
# tests named for each break go red. A named test that still passes against
# its break fails this script: it would be a test that cannot fail.
#
#   tests/mutation/run.sh BUILD_DIR [break ...]   every break, or those named
#
# BUILD_DIR holds walrelay-mutation and tests/integration_tests (test builds
# only: the breaks are compiled into them, inert unless WALRELAY_MUTATION
# names one; walrelay itself has none). The services must be running.
set -euo pipefail
build=$(cd "${1:?usage: $0 BUILD_DIR [break ...]}" && pwd)
shift

# break -> the tests that must fail against it (Catch test specs: a name, or
# its start followed by '*'; one a line).
declare -A catchers
catchers[confirm_before_ack]='relay with a fake sink: a record never acknowledged holds the slot*
relay with a fake sink: acknowledgements out of order*'
catchers[drop_records]='relay: every committed event arrives once*
relay: a partitioned outbox*'
catchers[reorder_key]='relay: per-key order holds across concurrent writers'
catchers[skip_dlq_wait]='relay with a fake sink: the dead-letter copy of a row that cannot be mapped*
relay with a fake sink: a record the broker refuses for its own reason*'
catchers[sigterm_no_wait]='fault: SIGTERM with records in flight*
relay with a fake sink: a record never acknowledged holds the slot*'
catchers[confirm_past_abort]='fault: exactly once - a record the broker refuses aborts*'
catchers[registry_dead_letters]='schema registry: a subject with no schema holds the stream*'
catchers[redrive_commit_early]='redrive: after a fix every dead letter reaches its topic*'
catchers[snapshot_resume_as_done]='snapshot: kill -9 in the middle of the snapshot*'
catchers[snapshot_commit_chunks]='snapshot: exactly once - the snapshot is one Kafka transaction*'
catchers[snapshot_retake_new_slot]='snapshot: events that leave no row - at least once*'
catchers[snapshot_retake_unfiltered]='snapshot: events that leave no row - exactly once*'
catchers[avro_decimal_rounds]='schema registry: Avro logical types are taken by what they mean*'
catchers[json_schema_draft4]='schema registry: a draft-07 JSON Schema is checked by its own draft*'
catchers[nats_ack_at_publish]='sinks: a frozen broker (SIGSTOP) - at most max.pending publishes wait while the walsender is held back and RSS stays flat - thawed\, everything arrives - Nats'
catchers[rabbitmq_keep_queued]='sinks: RabbitMQ - a connection lost with records still queued behind the ones on the wire*'
catchers[dead_letter_drop_when_full]='relay with a fake sink: a dead-letter copy that finds the queue full waits for room*
sinks: RabbitMQ - an unroutable record whose dead-letter copy finds the connection down*'
catchers[ledger_unbounded]='relay with a mock cluster: a record retried forever*'
catchers[redrive_read_uncommitted]='redrive: a dead-letter topic written in exactly-once mode*'
catchers[operator_sql_simple_protocol]="replay: POST /replay's where cannot leave its read-only transaction*
snapshot: an override cannot leave the snapshot's read-only transaction*"

breaks=("$@")
((${#breaks[@]})) || breaks=(confirm_before_ack drop_records reorder_key skip_dlq_wait sigterm_no_wait confirm_past_abort
                             registry_dead_letters nats_ack_at_publish snapshot_resume_as_done
                             redrive_commit_early snapshot_commit_chunks snapshot_retake_new_slot
                             snapshot_retake_unfiltered rabbitmq_keep_queued dead_letter_drop_when_full
                             avro_decimal_rounds json_schema_draft4 ledger_unbounded redrive_read_uncommitted
                             operator_sql_simple_protocol)

# Each (break, test) pair runs on its own slot and tables, so two run at once
# (WALRELAY_MUTATION_JOBS): the tests mostly wait on the servers. Verdicts
# are collected in the listed order.
jobs_max=${WALRELAY_MUTATION_JOBS:-2}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# run_one N BREAK SPEC: the verdict into $work/N.verdict, and "survived"
# into $work/N.survived when the test did not fail.
run_one() {
  local n=$1 b=$2 spec=$3 log="$work/$1.log" start rc took where what verdict
  start=$(date +%s)
  set +e
  WALRELAY_TEST_BINARY="$build/walrelay-mutation" WALRELAY_MUTATION="$b" \
    timeout 600 "$build/tests/integration_tests" "$spec" >"$log" 2>&1
  rc=$?
  set -e
  took=$(($(date +%s) - start))
  # Catch exits with the number of failed assertions; 0 means it passed.
  if grep -q "No test cases matched" "$log"; then
    touch "$work/$n.survived"
    verdict="NO SUCH TEST"
  elif ((rc == 0)); then
    touch "$work/$n.survived"
    verdict="SURVIVED (the test passed against the break)"
    tail -n 20 "$log" | sed 's/^/    /' >"$work/$n.tail"
  else
    where=$(grep -m1 -E "FAILED:" "$log" | sed 's|^.*/tests/integration/||; s/: FAILED:$//')
    what=$(grep -m1 -A1 -E "FAILED:" "$log" | tail -n 1 | sed 's/^ *//' | cut -c1-90)
    verdict="caught in ${took} s: \`$what\` ($where)"
  fi
  echo "$verdict" >"$work/$n.verdict"
  echo "    $b / $spec: $verdict"
}
pairs_break=()
pairs_spec=()
for b in "${breaks[@]}"; do
  [[ -n ${catchers[$b]:-} ]] || { echo "mutation: unknown break $b" >&2; exit 2; }
  while IFS= read -r spec; do
    pairs_break+=("$b")
    pairs_spec+=("$spec")
  done <<<"${catchers[$b]}"
done
running=()
for n in "${!pairs_break[@]}"; do
  while ((${#running[@]} >= jobs_max)); do
    wait -n || true
    still=()
    for pid in "${running[@]}"; do kill -0 "$pid" 2>/dev/null && still+=("$pid"); done
    running=("${still[@]}")
  done
  echo "==> mutation ${pairs_break[n]}: ${pairs_spec[n]}"
  run_one "$n" "${pairs_break[n]}" "${pairs_spec[n]}" &
  running+=($!)
done
wait
report=()
survived=0
for n in "${!pairs_break[@]}"; do
  [[ -f $work/$n.tail ]] && cat "$work/$n.tail"
  [[ -f $work/$n.survived ]] && survived=$((survived + 1))
  report+=("| \`${pairs_break[n]}\` | ${pairs_spec[n]} | $(cat "$work/$n.verdict" 2>/dev/null || echo "NO VERDICT") |")
  [[ -f $work/$n.verdict ]] || survived=$((survived + 1))
done

echo
echo "| break | test | result |"
echo "|---|---|---|"
printf '%s\n' "${report[@]}"
echo
if ((survived)); then
  echo "mutation: $survived named test(s) did not fail against their break"
  exit 1
fi
echo "mutation: every named test failed against its break"
