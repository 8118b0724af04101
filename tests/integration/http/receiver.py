#!/usr/bin/env python3
"""The tests' HTTP endpoint for walrelay's http sink: Python's standard
library only, independent of walrelay's code.

Each POST to /<topic> (/ is "_root") is answered 2xx once its request is appended to
STORE/<topic>.jsonl (flushed first: a 2xx means it is stored), or with a
fault the tests asked for (STORE/faults.json, read at each request). Every
attempt, answered or not, goes to STORE/<topic>.attempts.jsonl. HEAD answers
200 (walrelay --check). read.py reads the store.

  receiver.py --port N --store DIR
"""
import argparse
import json
import os
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

lock = threading.Lock()
sequence = 0


def fault_for(store, topic, body):
    """The first fault rule for this topic with attempts left (counted down)."""
    path = os.path.join(store, "faults.json")
    try:
        with open(path) as f:
            rules = json.load(f)
    except (OSError, ValueError):
        return None
    for rule in rules:
        if not topic.startswith(rule["prefix"]) or rule.get("count", 0) == 0:
            continue
        if rule.get("match") and rule["match"] not in body:
            continue
        if rule.get("min_size") and len(body.encode()) < rule["min_size"]:
            continue
        if rule.get("count", 0) > 0:
            rule["count"] -= 1
        with open(path + ".tmp", "w") as f:
            json.dump(rules, f)
        os.replace(path + ".tmp", path)
        return rule
    return None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        global sequence
        length = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(length)
        body = raw.decode("utf-8", errors="replace")
        path = self.path.lstrip("/")
        topic = urllib.parse.unquote(path) or "_root"  # (an SQS call's path is "/")
        headers = {name: value for name, value in self.headers.items()}
        store = self.server.store
        with lock:
            sequence += 1
            seq = sequence
            rule = fault_for(store, topic, body)
            attempt = {"seq": seq, "t": time.time(), "topic": topic, "path": path, "headers": headers,
                       "status": rule["status"] if rule else 200}
            if topic == "_root":
                attempt["body"] = body  # (an SQS call's, for its signature's check)
            with open(os.path.join(store, topic + ".attempts.jsonl"), "a") as f:
                f.write(json.dumps(attempt) + "\n")
            if not rule or 200 <= rule["status"] < 300:
                with open(os.path.join(store, topic + ".jsonl"), "a") as f:
                    f.write(json.dumps({"seq": seq, "t": time.time(), "topic": topic, "headers": headers,
                                        "body": body}) + "\n")
                    f.flush()
        if rule and rule.get("delay_ms"):
            time.sleep(rule["delay_ms"] / 1000)
        status = rule["status"] if rule else 200
        reply = (rule.get("reply", "") if rule else "").encode()
        self.send_response(status)
        if rule and rule.get("retry_after") is not None:
            self.send_header("Retry-After", str(rule["retry_after"]))
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)


def last_sequence(store):
    """The highest seq the store holds: a receiver started again on its store
    (http-start) goes on from there, so that seq stays the arrival order."""
    last = 0
    for name in os.listdir(store):
        if name.endswith(".jsonl"):
            with open(os.path.join(store, name)) as f:
                for line in f:
                    try:
                        last = max(last, json.loads(line)["seq"])
                    except (ValueError, KeyError):
                        pass
    return last


def main():
    global sequence
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--store", required=True)
    a = p.parse_args()
    os.makedirs(a.store, exist_ok=True)
    sequence = last_sequence(a.store)
    server = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    server.daemon_threads = True
    server.store = a.store
    server.serve_forever()


if __name__ == "__main__":
    main()
