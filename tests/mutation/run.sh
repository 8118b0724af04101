#!/usr/bin/env bash
# Breaks walrelay's guarantees on purpose, one at a time, and shows that the
# tests named for each break go red on the assertion named for them.
#
#   tests/mutation/run.sh BUILD_DIR [break ...]   every break, or those named
#
# BUILD_DIR holds walrelay-mutation and tests/integration_tests (test builds
# only: the breaks are compiled into them, inert unless WALRELAY_MUTATION
# names one; walrelay itself has none).
#
# Each (break, test) pair is judged twice, and only by what Catch reports
# (its XML reporter, per run):
#   - the baseline: the test with WALRELAY_MUTATION unset, against the same
#     walrelay-mutation, must pass; a test that fails without its break
#     proves nothing against it;
#   - the break: the test must fail on its named assertion (a piece of the
#     failing CHECK/REQUIRE as written in the source, or of a FAIL message).
# The verdicts: "caught" (failed on the named assertion), SURVIVED (passed
# against its break: a test that cannot fail), ERROR (anything else: a
# failure elsewhere, an exception, a crash, a time-out, no such test, a
# baseline that fails). Anything but "caught" fails the script.
#
# The script runs services of its own (scripts/services.sh with a
# WALRELAY_RUN_DIR under mktemp, cleaned at exit), never the caller's, so it
# can run beside the rest of the suite. The pairs whose test stops, freezes
# or restarts a server ("alone" below) run one at a time on a second set of
# services that only they use; the others run WALRELAY_MUTATION_JOBS (2) at
# a time on the first.
set -euo pipefail
build=$(cd "${1:?usage: $0 BUILD_DIR [break ...]}" && pwd)
shift
repo=$(cd "$(dirname "$0")/../.." && pwd)
services="$repo/scripts/services.sh"

# break -> the tests that must fail against it, one a line:
#   TEST SPEC @@ ASSERTION [@@ FLAGS]
# TEST SPEC is a Catch test spec (a name, or its start followed by '*';
# commas in a name escaped as '\,'). ASSERTION is a piece of the failing
# expression as written in the test (whitespace does not matter). FLAGS:
# "alone" when the test stops, freezes or restarts a server; "registry",
# "nats", "rabbitmq", "redis", "http", "sqs" for the services the test needs beside PostgreSQL and
# Kafka.
declare -A catchers
catchers[confirm_before_ack]='relay with a fake sink: a record never acknowledged holds the slot* @@ f.db().confirmed_flush(f.slot) < in_a
relay with a fake sink: acknowledgements out of order* @@ f.db().confirmed_flush(f.slot) < in_a'
catchers[drop_records]='relay: every committed event arrives once* @@ return f.db().confirmed_flush(f.slot) >= end
relay: a partitioned outbox* @@ seen[k] == 1'
catchers[reorder_key]='relay: per-key order holds across concurrent writers @@ seq > high'
catchers[skip_dlq_wait]='relay with a fake sink: the dead-letter copy of a row that cannot be mapped* @@ f.db().confirmed_flush(f.slot) < in_poison
relay with a fake sink: a record the broker refuses for its own reason* @@ f.db().confirmed_flush(f.slot) < in_big'
catchers[sigterm_no_wait]='fault: SIGTERM with records in flight* @@ f.db().confirmed_flush(f.slot) < first_commit_end @@ alone
relay with a fake sink: a record never acknowledged holds the slot* @@ f.db().confirmed_flush(f.slot) < in_a'
catchers[confirm_past_abort]='fault: exactly once - a record the broker refuses aborts* @@ f.db().confirmed_flush(f.slot) <= before_t1_commit'
catchers[registry_dead_letters]='schema registry: a subject with no schema holds the stream* @@ walrelay_schema_registry_requests_total{outcome=\"not_found\"} @@ registry'
catchers[redrive_commit_early]='redrive: after a fix every dead letter reaches its topic* @@ missing.empty()'
catchers[snapshot_resume_as_done]='snapshot: kill -9 in the middle of the snapshot* @@ missing.empty()'
catchers[snapshot_commit_chunks]='snapshot: exactly once - the snapshot is one Kafka transaction* @@ count_records'
catchers[snapshot_retake_new_slot]='snapshot: events that leave no row - at least once* @@ ghost_seen.size() == static_cast<std::size_t>(ghosts)'
catchers[snapshot_retake_unfiltered]='snapshot: events that leave no row - exactly once* @@ relay->running()'
catchers[avro_decimal_rounds]='schema registry: Avro logical types are taken by what they mean* @@ dead.size() == 1 @@ registry'
catchers[json_schema_draft4]='schema registry: a draft-07 JSON Schema is checked by its own draft* @@ r.status == 0 @@ registry'
catchers[nats_ack_at_publish]='sinks: a frozen broker (SIGSTOP) - at most max.pending publishes wait while the walsender is held back and RSS stays flat - thawed\, everything arrives - Nats @@ inflight_peak == max_pending @@ alone nats'
catchers[redis_ack_at_submit]='sinks: a frozen broker (SIGSTOP) - at most max.pending publishes wait while the walsender is held back and RSS stays flat - thawed\, everything arrives - Redis @@ inflight_peak == max_pending @@ alone redis'
catchers[http_retry_releases_key]='http: 503 and 429 are tried again in place* @@ attempts[i]["headers"]["Idempotency-Key"] == attempts[0]["headers"]["Idempotency-Key"] @@ http'
catchers[http_batch_not_split]='http: batches (sink.http.batch.enabled)* @@ elements == 20 @@ http'
catchers[sqs_call_ok_is_delivered]='sqs: a message SQS refuses fails on its own* @@ dead_recs.size() == 2 @@ sqs'
catchers[rabbitmq_keep_queued]='sinks: RabbitMQ - a connection lost with records still queued behind the ones on the wire* @@ seq > high @@ rabbitmq'
catchers[dead_letter_drop_when_full]='relay with a fake sink: a dead-letter copy that finds the queue full waits for room* @@ dead_letters_refused() >= 3
sinks: RabbitMQ - an unroutable record whose dead-letter copy finds the connection down* @@ confirmed_flush(f.slot) < in_lost @@ rabbitmq'
catchers[ledger_unbounded]='relay with a mock cluster: a record retried forever* @@ largest.load() <= 2 * max_inflight + 2'
catchers[redrive_read_uncommitted]='redrive: a dead-letter topic written in exactly-once mode* @@ count_records(not_committed) == 0'
catchers[operator_sql_simple_protocol]="replay: POST /replay's where cannot leave its read-only transaction* @@ count
snapshot: an override cannot leave the snapshot's read-only transaction* @@ count"
catchers[dropped_slot_recreated]='fault: a slot dropped while walrelay is stopped* @@ slots() == "0"'
catchers[inflight_unbounded]='relay with a fake sink: max.inflight.records holds the source back* @@ p.sink->records().size() == limit'
catchers[snapshot_stream_overlap]='snapshot: rows committed while the slot is made are in the snapshot or in the stream* @@ duplicates_of(seen) == 0'
catchers[secrets_shown]='cli: --print-config shows no secret* @@ printed.output.find(password) == std::string::npos'
catchers[redis_place_not_reset]='sinks: Redis - a transaction the walsender sends again after a lost connection* @@ seen.duplicates() == 0 @@ redis'
catchers[redis_mark_past_dead_letter]='sinks: Redis - an event whose dead-letter copy failed stays below every stream* @@ (dead_recs = dead->read()).size() == 1 @@ redis'
catchers[zombie_not_fenced]='fault: exactly once - two walrelays on one slot\, the active one frozen* @@ seen.duplicates() == 0'

breaks=("$@")
((${#breaks[@]})) || breaks=(confirm_before_ack drop_records reorder_key skip_dlq_wait sigterm_no_wait confirm_past_abort
                             registry_dead_letters nats_ack_at_publish snapshot_resume_as_done
                             redrive_commit_early snapshot_commit_chunks snapshot_retake_new_slot
                             snapshot_retake_unfiltered rabbitmq_keep_queued dead_letter_drop_when_full
                             avro_decimal_rounds json_schema_draft4 ledger_unbounded redrive_read_uncommitted
                             operator_sql_simple_protocol dropped_slot_recreated inflight_unbounded
                             snapshot_stream_overlap secrets_shown zombie_not_fenced redis_ack_at_submit
                             http_retry_releases_key sqs_call_ok_is_delivered http_batch_not_split redis_place_not_reset
                             redis_mark_past_dead_letter)

jobs_max=${WALRELAY_MUTATION_JOBS:-2}
time_limit=${WALRELAY_MUTATION_TIMEOUT:-600}
started_at=$(date +%s)
work=$(mktemp -d)
run_dirs=()
workers=()
cleanup() {
  local pid dir
  for pid in "${workers[@]}"; do kill "$pid" 2>/dev/null || true; done
  # The test processes still running (an interrupted run), by their ids.
  # (No .pid file left is the normal case: cat fails, and under errexit and
  # pipefail a failing command in this trap would make the whole script fail.)
  { cat "$work"/*.pid 2>/dev/null || true; } | while read -r pid; do kill "$pid" 2>/dev/null || true; done
  for dir in "${run_dirs[@]}"; do WALRELAY_RUN_DIR=$dir "$services" clean >/dev/null 2>&1 || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The pairs, and the runs they need: a break run per pair, a baseline run
# per test (shared by the breaks that name the same test).
p_break=() p_spec=() p_expect=() p_alone=() p_base=()
declare -A base_of
b_spec=() b_alone=()
need_shared='' need_alone=''
for b in "${breaks[@]}"; do
  [[ -n ${catchers[$b]:-} ]] || { echo "mutation: unknown break $b" >&2; exit 2; }
  while IFS= read -r line; do
    spec=${line%% @@ *}
    rest=${line#* @@ }
    expect=${rest%% @@ *}
    flags=''
    [[ $rest == *' @@ '* ]] && flags=${rest#* @@ }
    alone=0
    [[ " $flags " == *' alone '* ]] && alone=1
    if ((alone)); then need_alone+=" $flags"; else need_shared+=" $flags"; fi
    key="$alone $spec"
    if [[ -z ${base_of[$key]:-} ]]; then
      base_of[$key]=${#b_spec[@]}
      b_spec+=("$spec")
      b_alone+=("$alone")
    fi
    p_break+=("$b") p_spec+=("$spec") p_expect+=("$expect") p_alone+=("$alone") p_base+=("${base_of[$key]}")
  done <<<"${catchers[$b]}"
done

# start_services DIR FLAGS: PostgreSQL and Kafka, and the services FLAGS
# names, in a run directory of their own.
start_services() {
  local dir=$1 flags=$2 s pids=() pid log
  log="$work/services.$(basename "$dir")"
  mkdir -p "$dir"
  # Side by side: each waits mostly for its own server (the JVMs take a while).
  for s in pg kafka registry nats rabbitmq redis http sqs; do
    if [[ $s == pg || $s == kafka || " $flags " == *" $s "* ]]; then
      WALRELAY_RUN_DIR=$dir "$services" start "$s" >"$log.$s.log" 2>&1 &
      pids+=($!)
    fi
  done
  for pid in "${pids[@]}"; do wait "$pid" || { tail -n 20 "$log".*.log >&2; return 1; }; done
  # The env file written once more, now that every service has its port.
  WALRELAY_RUN_DIR=$dir "$services" start pg >>"$log.pg.log" 2>&1
}
shared_dir=$(mktemp -d /tmp/walrelay-mutation-XXXXXX)
run_dirs+=("$shared_dir")
start_services "$shared_dir" "$need_shared" &
starting=($!)
alone_dir=''
if [[ -n $need_alone ]]; then
  alone_dir=$(mktemp -d /tmp/walrelay-mutation-alone-XXXXXX)
  run_dirs+=("$alone_dir")
  start_services "$alone_dir" "$need_alone" &
  starting+=($!)
fi
for pid in "${starting[@]}"; do wait "$pid" || { echo "mutation: ERROR: the services did not start" >&2; exit 1; }; done
echo "mutation: services up in $(($(date +%s) - started_at)) s"

# judge XML RC MODE EXPECT: "caught", "passed", "SURVIVED" or "ERROR" on the
# first line, what Catch said on the second.
judge() {
  python3 - "$@" "$time_limit" <<'PY'
import os, sys, xml.etree.ElementTree as ET
path, rc, mode, expect, limit = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
norm = lambda t: " ".join((t or "").split())
def say(kind, text):
    print(kind); print(text); sys.exit(0)
if rc == 124 or rc == 137:
    say("ERROR", f"timed out after {limit} s")
try:
    root = ET.parse(path).getroot()
except Exception:
    say("ERROR", f"exit {rc} and no complete report: the test process died (a crash or a kill)")
cases = root.findall(".//TestCase")
if not cases:
    say("ERROR", "no such test")
where = lambda el: f"{os.path.basename(el.get('filename', '?'))}:{el.get('line', '?')}"
failures = []  # (kind, text, where)
raw = []  # each failure's text as Catch wrote it
for case in cases:
    for el in case.iter():
        if el.tag == "Expression" and el.get("success") == "false":
            exc = el.find("Exception")
            if exc is not None:
                failures.append(("exception", norm(exc.text), where(el)))
                raw.append(exc.text or "")
            else:
                failures.append(("assertion", norm(el.findtext("Original")), where(el)))
                raw.append(el.findtext("Expanded") or "")
        elif el.tag in ("Exception", "FatalErrorCondition"):
            failures.append((el.tag.lower(), norm(el.text), where(el)))
            raw.append(el.text or "")
        elif el.tag == "Failure":
            failures.append(("assertion", norm(el.text), where(el)))
            raw.append(el.text or "")
ok = all(c.find("OverallResult") is not None and c.find("OverallResult").get("success") == "true" for c in cases)
if rc == 0 and ok and not failures:
    say("passed" if mode == "baseline" else "SURVIVED", "the test passed")
if not failures:
    say("ERROR", f"exit {rc} with no failure in the report")
first = failures[0]
if mode == "baseline":
    say("ERROR", f"fails without its break: {first[0]} `{first[1][:100]}` ({first[2]})")
for kind, text, at in failures:
    if kind == "assertion" and norm(expect) in text:
        say("caught", f"`{text[:100]}` ({at})")
# (The whole of that failure from the third line on: a FAIL's message
# carries walrelay's log tail, which says why it stopped.)
print("ERROR"); print(f"failed elsewhere: {first[0]} `{first[1][:100]}` ({first[2]})"); print(raw[0][:6000])
sys.exit(0)
PY
}

# run_one ID DIR BREAK SPEC EXPECT: one run (a baseline when BREAK is
# empty), its verdict and time into $work/ID.{verdict,took}.
run_one() {
  local id=$1 dir=$2 b=$3 spec=$4 expect=$5 start rc mode=break
  [[ -n $b ]] || mode=baseline
  start=$(date +%s)
  set +e
  if [[ -n $b ]]; then
    WALRELAY_RUN_DIR=$dir WALRELAY_TEST_BINARY="$build/walrelay-mutation" WALRELAY_MUTATION="$b" \
      timeout "$time_limit" "$build/tests/integration_tests" "$spec" -r xml -o "$work/$id.xml" >"$work/$id.log" 2>&1 &
  else
    WALRELAY_RUN_DIR=$dir WALRELAY_TEST_BINARY="$build/walrelay-mutation" \
      env -u WALRELAY_MUTATION timeout "$time_limit" "$build/tests/integration_tests" "$spec" -r xml -o "$work/$id.xml" \
      >"$work/$id.log" 2>&1 &
  fi
  echo $! >"$work/$id.pid"
  wait $!
  rc=$?
  set -e
  rm -f "$work/$id.pid"
  echo $(($(date +%s) - start)) >"$work/$id.took"
  judge "$work/$id.xml" "$rc" "$mode" "$expect" >"$work/$id.verdict"
  echo "    $(head -n 1 "$work/$id.verdict") in $(cat "$work/$id.took") s: ${b:-baseline} / $spec: $(sed -n 2p "$work/$id.verdict")"
}

# The runs: "alone" ones in a queue of their own, the rest shared.
alone_runs=() shared_runs=()
for n in "${!b_spec[@]}"; do
  if ((b_alone[n])); then alone_runs+=("base.$n"); else shared_runs+=("base.$n"); fi
done
for n in "${!p_break[@]}"; do
  if ((p_alone[n])); then alone_runs+=("pair.$n"); else shared_runs+=("pair.$n"); fi
done
# start_run ID DIR: the run ID names, on DIR's services.
start_run() {
  local id=$1 dir=$2 n=${1#*.}
  if [[ $id == base.* ]]; then
    run_one "$id" "$dir" "" "${b_spec[n]}" ""
  else
    run_one "$id" "$dir" "${p_break[n]}" "${p_spec[n]}" "${p_expect[n]}"
  fi
}
# A worker takes the shared runs in order, each once (mkdir claims it).
take_shared() {
  local id
  for id in "${shared_runs[@]}"; do
    mkdir "$work/$id.claimed" 2>/dev/null || continue
    start_run "$id" "$shared_dir"
  done
}
# The first worker does the alone runs first, one at a time.
(
  for id in "${alone_runs[@]}"; do start_run "$id" "$alone_dir"; done
  take_shared
) &
workers+=($!)
for ((w = 1; w < jobs_max; ++w)); do
  take_shared &
  workers+=($!)
done
for pid in "${workers[@]}"; do wait "$pid" || true; done
workers=()  # ended: their ids are no longer theirs to kill

verdict() { head -n 1 "$work/$1.verdict" 2>/dev/null || echo ERROR; }
said() { sed -n 2p "$work/$1.verdict" 2>/dev/null || echo "no verdict"; }
bad=0
report=()
missed=()  # said again at the very end: a CI page that shows only the output's ends still names them
for n in "${!p_break[@]}"; do
  base="base.${p_base[n]}" pair="pair.$n"
  if [[ $(verdict "$base") != passed ]]; then
    result="ERROR: the baseline $(said "$base")"
  elif [[ $(verdict "$pair") == caught ]]; then
    result="caught in $(cat "$work/$pair.took") s: $(said "$pair") (baseline passed in $(cat "$work/$base.took") s)"
  else
    result="$(verdict "$pair"): $(said "$pair")"
  fi
  if [[ $result != caught* ]]; then
    bad=$((bad + 1))
    missed+=("  ${p_break[n]} / ${p_spec[n]}: ${result:0:300}")
  fi
  # The run that went wrong: the baseline when it failed, else the break's.
  failed_run=$pair
  [[ $result != "ERROR: the baseline"* ]] || failed_run=$base
  if [[ $result != caught* && -f $work/$failed_run.log ]]; then
    echo "--- ${p_break[n]} / ${p_spec[n]}: the end of the ${failed_run%%.*} run's output"
    tail -n 20 "$work/$failed_run.log" | sed 's/^/    /'
    if [[ $(sed -n '3,$p' "$work/$failed_run.verdict") ]]; then
      echo "--- ${p_break[n]} / ${p_spec[n]}: its first failure, whole"
      sed -n '3,$p' "$work/$failed_run.verdict" | sed 's/^/    /'
    fi
  fi
  report+=("| \`${p_break[n]}\` | ${p_spec[n]} | \`${p_expect[n]}\` | $result |")
done

echo
echo "| break | test | named assertion | result |"
echo "|---|---|---|---|"
printf '%s\n' "${report[@]}"
echo
took=$(($(date +%s) - started_at))
if ((bad)); then
  echo "mutation: $bad of ${#p_break[@]} pair(s) not caught on their named assertion (${took} s):"
  printf '%s\n' "${missed[@]}"
  exit 1
fi
echo "mutation: every named test failed on its named assertion against its break, and passed without it (${took} s)"
