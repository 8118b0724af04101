#!/usr/bin/env python3
"""RabbitMQ through pika (not walrelay's code): the RabbitMQ sink tests'
independent client.

  read.py --url HOST:PORT declare --exchange X --queue Q --binding 'a.#' [--max-length-bytes N]
  read.py --url HOST:PORT delete --exchange X --queue Q
  read.py --url HOST:PORT read --queue Q [--count N] [--timeout S]

`declare` makes a durable topic exchange and a durable queue bound to it.
`read` waits until the queue holds at least --count messages (or the
time-out), then takes every message (acknowledged, so read once) until
the queue is empty, and prints
each as one JSON line: {"seq", "routing_key", "data", "headers",
"message_id", "delivery_mode"}. Exit 1 on a time-out.
"""
import argparse
import json
import sys
import time

import pika


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("declare")
    d.add_argument("--exchange", required=True)
    d.add_argument("--queue", required=True)
    d.add_argument("--binding", required=True)
    x = sub.add_parser("delete")
    x.add_argument("--exchange", required=True)
    x.add_argument("--queue", required=True)
    r = sub.add_parser("read")
    r.add_argument("--queue", required=True)
    r.add_argument("--count", type=int, default=0)
    r.add_argument("--timeout", type=float, default=30.0)
    args = p.parse_args()

    host, port = args.url.rsplit(":", 1)
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        host=host, port=int(port), credentials=pika.PlainCredentials("guest", "guest")))
    ch = conn.channel()
    try:
        if args.cmd == "declare":
            ch.exchange_declare(exchange=args.exchange, exchange_type="topic", durable=True)
            ch.queue_declare(queue=args.queue, durable=True)
            ch.queue_bind(queue=args.queue, exchange=args.exchange, routing_key=args.binding)
            return 0
        if args.cmd == "delete":
            ch.queue_delete(queue=args.queue)
            ch.exchange_delete(exchange=args.exchange)
            return 0
        deadline = time.monotonic() + args.timeout
        while True:
            n = ch.queue_declare(queue=args.queue, passive=True).method.message_count
            if n >= args.count:
                break
            if time.monotonic() > deadline:
                print(f"read.py: {n} of {args.count} messages after {args.timeout} s", file=sys.stderr)
                return 1
            time.sleep(0.1)
        # Pushed to us (a window of 2,000 unacknowledged), acknowledged in
        # steps: basic_get's round trip a message read the fault campaign's
        # 750,000 in more than ten minutes. Done when nothing has come for
        # half a second and the queue has none ready; what was pushed and
        # not printed goes back to the queue with the consumer's cancel
        # (rejected, requeued).
        ch.basic_qos(prefetch_count=2000)
        seq = 0
        last_tag = acked = None
        for method, props, body in ch.consume(args.queue, auto_ack=False, inactivity_timeout=0.5):
            if method is None:
                # Quiet for half a second: done when the queue holds nothing
                # ready either (a loaded broker can pause longer than that).
                if ch.queue_declare(queue=args.queue, passive=True).method.message_count == 0:
                    break
                continue
            last_tag = method.delivery_tag
            if seq % 1000 == 999:
                ch.basic_ack(last_tag, multiple=True)
                acked = last_tag
            seq += 1
            headers = {k: (v.decode("utf-8", "replace") if isinstance(v, bytes) else v)
                       for k, v in (props.headers or {}).items()}
            print(json.dumps({"seq": seq, "routing_key": method.routing_key,
                              "data": body.decode("utf-8", "replace") if body else "",
                              "headers": headers, "message_id": props.message_id,
                              "delivery_mode": props.delivery_mode}))
        if last_tag != acked:
            ch.basic_ack(last_tag, multiple=True)
        ch.cancel()
        return 0
    finally:
        conn.close()


if __name__ == "__main__":
    sys.exit(main())
