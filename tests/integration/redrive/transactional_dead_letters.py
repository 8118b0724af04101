#!/usr/bin/env python3
"""Dead letters written in a Kafka transaction that does not commit, through
confluent-kafka (not walrelay's code): the redrive tests' other writer.

  transactional_dead_letters.py --bootstrap B --topic DLQ --target T --count N --id-prefix P
                                [--hold SECONDS] [--status FILE]

Produces N records to DLQ in one transaction, over all its partitions, each a dead letter as walrelay
writes one for a record the broker refused (headers __connect.errors.topic=T,
walrelay.DeliveryError, id=P<i>), so that a redrive that read them would send
them to T. Then aborts the transaction: at once, or after --hold seconds
during which it stays open (the partition's last stable offset held before
it). --status FILE gets "open" once the records are acknowledged in the open
transaction, then "aborted".
"""
import argparse
import time

from confluent_kafka import Producer


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--id-prefix", required=True)
    p.add_argument("--hold", type=float, default=0)
    p.add_argument("--status", default="")
    a = p.parse_args()

    def status(s):
        if a.status:
            with open(a.status, "w") as f:
                f.write(s + "\n")

    producer = Producer({"bootstrap.servers": a.bootstrap, "transactional.id": "redrive-test-" + a.id_prefix,
                         "transaction.timeout.ms": int(max(60, a.hold + 30) * 1000)})
    # Spread over every partition, so that each ends with the transaction.
    partitions = len(producer.list_topics(a.topic, 30).topics[a.topic].partitions)
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(a.count):
        producer.produce(a.topic, value=('{"seq": %d}' % i).encode(), key=None, partition=i % partitions,
                         headers=[("id", (a.id_prefix + str(i)).encode()),
                                  ("__connect.errors.topic", a.target.encode()),
                                  ("__connect.errors.exception.class.name", b"walrelay.DeliveryError"),
                                  ("__connect.errors.exception.message", b"Broker: Policy violation"),
                                  ("walrelay.error.reason", b"policy_violation")])
    if producer.flush(30) != 0:
        raise SystemExit("records not acknowledged")
    status("open")
    time.sleep(a.hold)
    producer.abort_transaction(30)
    status("aborted")


if __name__ == "__main__":
    main()
