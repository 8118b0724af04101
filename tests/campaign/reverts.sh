#!/usr/bin/env bash
# The campaign against the fixes it is for, reverted one at a time: for each
# break (walrelay-mutation with WALRELAY_MUTATION set), up to five seeds of a
# one-minute leg; the break is caught when a seed's checker goes red.
#
#   tests/campaign/reverts.sh BUILD_DIR [break:sink[:fault,...] ...]
#
# Exit 1 if a break survives all five seeds. A pair's faults (campaign.py
# --faults) draw that break's seeds from those kinds only. Runs on the
# `campaign` group's servers (started and stopped here unless they run
# already).
set -euo pipefail
build=$(cd "${1:?usage: $0 BUILD_DIR [break:sink[:fault,...] ...]}" && pwd)
shift
here="$(cd "$(dirname "$0")" && pwd)"
services="$here/../../scripts/services.sh"
export WALRELAY_SERVICES_GROUP=${WALRELAY_SERVICES_GROUP:-campaign}
py=$("$here/../../scripts/py-venv.sh")
pairs=("$@")
# By default all of them: the interrupted snapshot's fixes (losing what its
# first slot held; sending rows its view did not see) and the RabbitMQ
# reconnect's (sending what was queued behind a failed record on the next
# connection). The latter draws only from the faults that lose the broker's
# connection while walrelay's threads are out of step (campaign.py --faults):
# in the whole mix the one that opens its window, sink_thread_ahead, is one
# draw in thirteen, and a minute has about nine.
((${#pairs[@]})) || pairs=(snapshot_retake_new_slot:kafka snapshot_retake_unfiltered:kafka
  rabbitmq_keep_queued:rabbitmq:sink_thread_ahead,loop_starved,net_reset)
started=0
stop_started() { if ((started)); then "$services" stop all >/dev/null 2>&1 || true; fi; }
trap stop_started EXIT
if ! "$services" status >/dev/null 2>&1; then
  started=1
  "$services" start >/dev/null
fi
survived=0
report=()
for pair in "${pairs[@]}"; do
  IFS=: read -r brk sink faults <<<"$pair"
  verdict="SURVIVED five seeds"
  for try in 1 2 3 4 5; do
    seed=$((RANDOM * 32768 + RANDOM))
    log=$(mktemp /tmp/walrelay-reverts-XXXXXX.log)
    if WALRELAY_MUTATION=$brk "$py" "$here/campaign.py" --walrelay "$build/walrelay-mutation" --sink "$sink" \
      ${faults:+--faults "$faults"} --duration 60 --seed "$seed" >"$log" 2>&1; then
      echo "reverts: $brk on $sink: seed $seed passed (try $try)"
    else
      # Caught only by what the checker is for (a loss, an order break, a
      # duplicate, a rolled-back or misrouted event), not by a failure of
      # the run itself.
      first=$(grep -m1 -E "problem: .*(missing|order breaks|more than once|rolled back|dead-letter)" "$log" \
        | sed 's/.*problem: //' || true)
      if [[ -n $first ]]; then
        verdict="caught by seed $seed (try $try): $first"
        echo "reverts: $brk on $sink: $verdict"
        break
      fi
      echo "reverts: $brk on $sink: seed $seed failed for another reason (try $try): $(grep -m1 "problem:" "$log")"
    fi
    rm -f "$log"
  done
  [[ $verdict == caught* ]] || survived=$((survived + 1))
  report+=("| \`$brk\` | $sink${faults:+ (--faults $faults)} | $verdict |")
done
echo
echo "| break | sink | campaign |"
echo "|---|---|---|"
printf '%s\n' "${report[@]}"
((survived == 0))
