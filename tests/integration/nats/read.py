#!/usr/bin/env python3
"""NATS JetStream, through nats-py (not walrelay's code): the NATS sink tests'
independent client.

  read.py --url URL stream-add --name S --subjects a.>,b [--duplicate-window S] [--max-msg-size N] [--storage file]
  read.py --url URL stream-delete --name S
  read.py --url URL read --name S [--count N] [--timeout S]

`read` waits until the stream holds at least --count messages (or the
time-out), then prints each stored message in stream order as one JSON
line: {"seq", "subject", "data", "headers"}. Exit 1 on a time-out.
"""
import argparse
import asyncio
import json
import sys
import time

import nats
from nats.js.api import StorageType, StreamConfig
from nats.js.errors import NotFoundError


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True, help="nats:// or tls://, with user:password@ when the server asks")
    p.add_argument("--ca", default="", help="a CA file (PEM) to verify a TLS server")
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("stream-add")
    a.add_argument("--name", required=True)
    a.add_argument("--subjects", required=True)
    a.add_argument("--duplicate-window", type=float, default=120.0)
    a.add_argument("--max-msg-size", type=int, default=-1)
    a.add_argument("--storage", default="file")
    d = sub.add_parser("stream-delete")
    d.add_argument("--name", required=True)
    r = sub.add_parser("read")
    r.add_argument("--name", required=True)
    r.add_argument("--count", type=int, default=0)
    r.add_argument("--timeout", type=float, default=30.0)
    args = p.parse_args()

    tls = None
    if args.ca:
        import ssl
        tls = ssl.create_default_context(cafile=args.ca)
    nc = await nats.connect(args.url, allow_reconnect=False, tls=tls)
    js = nc.jetstream()
    try:
        if args.cmd == "stream-add":
            await js.add_stream(StreamConfig(
                name=args.name, subjects=args.subjects.split(","), duplicate_window=args.duplicate_window,
                max_msg_size=args.max_msg_size,
                storage=StorageType.MEMORY if args.storage == "memory" else StorageType.FILE))
            return 0
        if args.cmd == "stream-delete":
            try:
                await js.delete_stream(args.name)
            except NotFoundError:
                pass
            return 0
        deadline = time.monotonic() + args.timeout
        while True:
            info = await js.stream_info(args.name)
            if info.state.messages >= args.count:
                break
            if time.monotonic() > deadline:
                print(f"read.py: {info.state.messages} of {args.count} messages after {args.timeout} s",
                      file=sys.stderr)
                return 1
            await asyncio.sleep(0.1)
        if info.state.messages == 0:
            return 0
        first, last = info.state.first_seq, info.state.last_seq
        seqs = list(range(first, last + 1))
        for i in range(0, len(seqs), 256):
            msgs = await asyncio.gather(*(js.get_msg(args.name, seq=s) for s in seqs[i:i + 256]))
            for m in msgs:
                headers = dict(m.headers or {})
                print(json.dumps({"seq": m.seq, "subject": m.subject,
                                  "data": m.data.decode("utf-8", "replace") if m.data else "",
                                  "headers": headers}))
        return 0
    finally:
        await nc.close()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
