#!/usr/bin/env bash
# Makes the Python virtualenv of the tests' independent readers
# (tests/integration/registry/read.py): confluent-kafka with the extras of
# its schema-registry serializers (Avro, JSON Schema, Protobuf) and
# grpcio-tools, whose grpc_tools.protoc compiles a registry's .proto at run
# time; nats-py, pika, redis-py and boto3, the NATS JetStream, RabbitMQ, Redis
# and SQS sinks' readers (tests/integration/nats/read.py, tests/integration/rabbitmq/read.py,
# tests/integration/redis/read.py, tests/integration/sqs/read.py).
# From PyPI into $CACHE_ROOT/test-venv (WALRELAY_TEST_VENV overrides);
# prints the venv's python. Idempotent: a venv that has these requirements
# is reused without touching the network.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
venv="${WALRELAY_TEST_VENV:-$CACHE_ROOT/test-venv}"
requirements=(
  "confluent-kafka[avro,json,protobuf]==2.16.1"
  "grpcio-tools==1.85.1"
  "nats-py==2.16.0"
  "pika==1.4.4"
  "redis==7.0.1"
  "boto3==1.44.5"
)
stamp="$venv/.walrelay-requirements"
if [[ -x $venv/bin/python && -f $stamp && $(cat "$stamp") == "${requirements[*]}" ]]; then
  echo "$venv/bin/python"
  exit 0
fi
echo "py-venv: installing ${requirements[*]} into $venv" >&2
[[ -x $venv/bin/python ]] || python3 -m venv "$venv" >&2
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${requirements[@]}" >&2
"$venv/bin/python" -c 'import confluent_kafka, fastavro, jsonschema, google.protobuf, grpc_tools.protoc, nats, pika, redis, boto3' >&2
echo "${requirements[*]}" > "$stamp"
echo "$venv/bin/python"
