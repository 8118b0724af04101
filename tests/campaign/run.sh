#!/usr/bin/env bash
# One leg of the fault campaign under CTest: run.sh WALRELAY SINK [DURATION [CAMPAIGN ARGS...]]
# (tests/campaign/campaign.py in the test venv; a fresh seed, printed first).
# The campaign fixture's servers (WALRELAY_SERVICES_GROUP=campaign) must run;
# the leg starts NATS, RabbitMQ, Redis or the HTTP receiver itself when its sink needs them.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
py=$("$here/../../scripts/py-venv.sh")
exec nice "$py" "$here/campaign.py" --walrelay "$1" --sink "$2" --duration "${3:-60}" "${@:4}"
