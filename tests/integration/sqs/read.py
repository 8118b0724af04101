#!/usr/bin/env python3
"""Reads SQS queues with boto3 for the tests (ElasticMQ started by
scripts/services.sh), never with walrelay's code. A queue's reads take its
messages, so each read drains the queues into a store of JSON lines
(--store, one file per queue, under a lock) and prints the whole store: every
read sees everything, as a stream's reader would. Lines are shaped like the
other brokers' readers': subject (the queue's name, --prefix replaced by
--subject-prefix, ".fifo" left off), seq (the order the queue gave them in:
a FIFO queue gives each group's in its order; ElasticMQ's SequenceNumber
starts again after a restart, so it cannot order them), data (the body), headers (the message
attributes; the key as `key`), message_id (MessageDeduplicationId) and group
(MessageGroupId).

  read.py read   --endpoint URL --store DIR --prefix P [--subject-prefix S] [--count N] [--timeout S]
  read.py create --endpoint URL --queue NAME... [--max-size BYTES]   (a name ending in .fifo: a FIFO queue)
  read.py delete --endpoint URL --store DIR --prefix P
"""
import argparse
import base64
import fcntl
import json
import os
import sys
import time

import boto3
from botocore.config import Config


def client(endpoint):
    # ElasticMQ answers 503 when busy (a large queue kept in H2): tried again.
    return boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id="walrelay-test", aws_secret_access_key="walrelay-test-secret",
                        config=Config(retries={"max_attempts": 20, "mode": "standard"}, read_timeout=120))


def queues(sqs, prefix):
    urls = sqs.list_queues(QueueNamePrefix=prefix).get("QueueUrls", [])
    return sorted(urls)


def drain(sqs, url, path):
    """Moves what the queue holds into the store file, in the queue's order."""
    with open(path, "a") as out:
        while True:
            got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0, VisibilityTimeout=60,
                                      MessageSystemAttributeNames=["All"], MessageAttributeNames=["All"])
            messages = got.get("Messages", [])
            if not messages:
                return
            for m in messages:
                attributes = {}
                for name, a in m.get("MessageAttributes", {}).items():
                    if "StringValue" in a:
                        attributes[name] = a["StringValue"]
                    else:
                        attributes[name] = base64.b64encode(a["BinaryValue"]).decode()
                system = m.get("Attributes", {})
                out.write(json.dumps({"body": m["Body"], "attributes": attributes,
                                      "sequence": system.get("SequenceNumber"),
                                      "dedup": system.get("MessageDeduplicationId"),
                                      "group": system.get("MessageGroupId"),
                                      "arrival": time.time_ns()}) + "\n")
            out.flush()
            os.fsync(out.fileno())
            sqs.delete_message_batch(QueueUrl=url, Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)])


def stored(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def read(args):
    sqs = client(args.endpoint)
    os.makedirs(args.store, exist_ok=True)
    deadline = time.time() + args.timeout
    while True:
        records = []
        for url in queues(sqs, args.prefix):
            name = url.rsplit("/", 1)[1]
            path = os.path.join(args.store, name + ".jsonl")
            with open(path + ".lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                drain(sqs, url, path)
                got = stored(path)
            subject = name[:-len(".fifo")] if name.endswith(".fifo") else name
            if args.subject_prefix is not None and subject.startswith(args.prefix):
                subject = args.subject_prefix + subject[len(args.prefix):]
            for r in got:
                records.append((subject, r))
        if len(records) >= args.count or time.time() >= deadline:
            break
        time.sleep(0.2)
    for seq, (subject, r) in enumerate(records):
        print(json.dumps({"subject": subject, "seq": seq, "data": r["body"], "headers": r["attributes"],
                          "message_id": r["dedup"], "group": r["group"]}))


def create(args):
    sqs = client(args.endpoint)
    for name in args.queue:
        attributes = {}
        if name.endswith(".fifo"):
            attributes["FifoQueue"] = "true"
        if args.max_size:
            attributes["MaximumMessageSize"] = str(args.max_size)
        print(sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"])


def delete(args):
    sqs = client(args.endpoint)
    for url in queues(sqs, args.prefix):
        sqs.delete_queue(QueueUrl=url)
    if os.path.isdir(args.store):
        for f in os.listdir(args.store):
            if f.startswith(args.prefix):
                os.remove(os.path.join(args.store, f))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["read", "create", "delete"])
    p.add_argument("--endpoint", required=True)
    p.add_argument("--store", default="")
    p.add_argument("--prefix", default="")
    p.add_argument("--subject-prefix")
    p.add_argument("--count", type=int, default=0)
    p.add_argument("--timeout", type=float, default=0)
    p.add_argument("--queue", nargs="*", default=[])
    p.add_argument("--max-size", type=int, default=0)
    args = p.parse_args()
    {"read": read, "create": create, "delete": delete}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
