#!/usr/bin/env python3
"""A polling outbox relay, the usual alternative to log-based relaying, for the
benchmark: in one transaction, lock the oldest `batch` rows
(ORDER BY seq LIMIT n FOR UPDATE SKIP LOCKED), publish them with an idempotent
acks=all producer, wait for every acknowledgement, DELETE them, commit. Polls
again at once while rows come back, sleeps 1 s when the outbox is empty.
Routing is the Outbox Event Router's: topic <prefix>.<aggregatetype>, key
aggregateid, value payload, header id.

`seq` (a bigserial) orders the rows: `id` is a random uuid, so ORDER BY id would
not be insertion order.
"""
import argparse
import signal
import sys
import time

import psycopg
from confluent_kafka import KafkaException, Producer

SELECT = ("SELECT id::text, aggregatetype, aggregateid, payload::text FROM outbox "
          "ORDER BY seq LIMIT %s FOR UPDATE SKIP LOCKED")
DELETE = "DELETE FROM outbox WHERE id = ANY(%s::uuid[])"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic-prefix", required=True)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--idle-poll-s", type=float, default=1.0)
    args = ap.parse_args()

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    producer = Producer({"bootstrap.servers": args.bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5, "partitioner": "murmur2_random"})
    failures = []

    def on_delivery(err, _msg):
        if err is not None:
            failures.append(err)

    with psycopg.connect(args.dsn) as conn:
        while not stop:
            with conn.transaction():
                rows = conn.execute(SELECT, (args.batch,)).fetchall()
                for event_id, aggregatetype, aggregateid, payload in rows:
                    while True:
                        try:
                            producer.produce(f"{args.topic_prefix}.{aggregatetype}", key=aggregateid, value=payload,
                                             headers=[("id", event_id)], on_delivery=on_delivery)
                            break
                        except BufferError:
                            producer.poll(0.01)  # queue full: backpressure, never drop
                    producer.poll(0)
                if rows:
                    if producer.flush(60) != 0 or failures:
                        raise KafkaException(f"could not publish a batch: {failures[:1] or 'flush timed out'}")
                    conn.execute(DELETE, ([r[0] for r in rows],))
            if not rows:
                time.sleep(args.idle_poll_s)
    producer.flush(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
