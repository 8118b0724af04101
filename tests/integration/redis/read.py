#!/usr/bin/env python3
"""Redis Streams, through redis-py (not walrelay's code): the Redis sink
tests' independent client.

  read.py --url HOST:PORT read --prefix P [--count N] [--timeout S]
  read.py --url HOST:PORT delete --prefix P
  read.py --url HOST:PORT set --key K --value V      a plain string key (a stream name taken)

`read` waits until the streams whose names start with --prefix hold at least
--count entries in all (or the time-out), then prints each entry, stream by
stream in entry-id order, as one JSON line: {"seq" (its place in its stream),
"subject" (the stream), "entry_id", "data" (the value field), "headers" (the
headers field's members, with "key" and "entry_event_id" from the key and id
fields)}. Exit 1 on a time-out.
"""
import argparse
import json
import sys
import time

import redis


def streams(r, prefix):
    return sorted(k.decode() for k in r.scan_iter(match=prefix + "*", count=1000, _type="stream"))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True, help="host:port")
    p.add_argument("--password", default="")
    sub = p.add_subparsers(dest="cmd", required=True)
    rd = sub.add_parser("read")
    rd.add_argument("--prefix", required=True)
    rd.add_argument("--count", type=int, default=0)
    rd.add_argument("--timeout", type=float, default=30.0)
    d = sub.add_parser("delete")
    d.add_argument("--prefix", required=True)
    s = sub.add_parser("set")
    s.add_argument("--key", required=True)
    s.add_argument("--value", required=True)
    args = p.parse_args()
    host, port = args.url.rsplit(":", 1)
    r = redis.Redis(host=host, port=int(port), password=args.password or None)
    if args.cmd == "delete":
        for k in r.scan_iter(match=args.prefix + "*", count=1000):
            r.delete(k)
        return 0
    if args.cmd == "set":
        r.set(args.key, args.value)
        return 0
    deadline = time.monotonic() + args.timeout
    while True:
        names = streams(r, args.prefix)
        total = sum(r.xlen(n) for n in names)
        if total >= args.count:
            break
        if time.monotonic() > deadline:
            print(f"read.py: {total} of {args.count} entries after {args.timeout} s", file=sys.stderr)
            return 1
        time.sleep(0.1)
    for name in names:
        seq = 0
        last = "-"
        while True:
            batch = r.xrange(name, min=last, max="+", count=1000)
            if last != "-":
                batch = batch[1:]
            if not batch:
                break
            for entry_id, fields in batch:
                f = {k.decode(): v.decode("utf-8", "replace") for k, v in fields.items()}
                headers = json.loads(f["headers"]) if "headers" in f else {}
                if "key" in f:
                    headers["key"] = f["key"]
                if "id" in f:
                    headers["entry_event_id"] = f["id"]
                print(json.dumps({"seq": seq, "subject": name, "entry_id": entry_id.decode(),
                                  "data": f.get("value", ""), "headers": headers}))
                seq += 1
            last = batch[-1][0].decode()
    return 0


if __name__ == "__main__":
    sys.exit(main())
