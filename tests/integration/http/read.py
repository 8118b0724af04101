#!/usr/bin/env python3
"""Reads what receiver.py stored, for the tests, as JSON lines shaped like the
other brokers' readers: subject (the path's topic), seq (arrival order),
data (the body), headers (the record's, their prefix and base64 undone; the
key as `key`), message_id (Idempotency-Key), and signature_ok when --secret
is given (Standard Webhooks, checked here with Python's hmac).

  read.py read --store DIR --prefix P [--count N] [--timeout S] [--secret whsec_...] [--batches]
          --batches: a request whose body is a JSON array (sink.http.batch.enabled) is read as its
          elements, each a record of its own in the array's order (seq: the request's x 100000 + its
          place); batch.format=records elements give their id (message_id), key and headers
  read.py attempts --store DIR --prefix P    every attempt, answered or not
  read.py fault --store DIR --prefix P --status N [--count N] [--retry-after S] [--match TEXT] [--min-size BYTES]
          [--delay-ms N] [--reply TEXT]    the next N requests (every one without --count) answered so
  read.py delete --store DIR --prefix P
  read.py sigv4 --store DIR --prefix P --secret KEY   each attempt's AWS Signature V4 checked with KEY
          (hashlib and hmac, as AWS's documents say; the sqs sink's calls)
"""
import argparse
import base64
import glob
import hashlib
import hmac
import json
import os
import sys
import time

PREFIX = "x-debezium-"


def load(store, prefix, suffix):
    out = []
    for path in glob.glob(os.path.join(glob.escape(store), glob.escape(prefix) + "*" + suffix)):
        if suffix == ".jsonl" and path.endswith(".attempts.jsonl"):
            continue
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    out.append(json.loads(line))
    out.sort(key=lambda r: r["seq"])
    return out


def signature_ok(secret, headers, body):
    key = base64.b64decode(secret[len("whsec_"):])
    h = {k.lower(): v for k, v in headers.items()}
    signed = "%s.%s.%s" % (h.get("webhook-id", ""), h.get("webhook-timestamp", ""), body)
    expected = base64.b64encode(hmac.new(key, signed.encode(), hashlib.sha256).digest()).decode()
    given = [s.split(",", 1)[1] for s in h.get("webhook-signature", "").split(" ") if s.startswith("v1,")]
    return any(hmac.compare_digest(expected, g) for g in given)


def sigv4_check(attempt, secret):
    """{"ok": the signature is the one KEY makes, "signed": the signed headers}:
    the canonical request from the headers the Authorization names, the path,
    no query and the body's SHA-256; the key derived from the date, region
    and service of its credential scope."""
    h = {k.lower(): v for k, v in attempt["headers"].items()}
    fields = dict(part.strip().split("=", 1) for part in h.get("authorization", "").split(" ", 1)[-1].split(","))
    _, date, region, service, _ = fields["Credential"].split("/")
    signed = fields["SignedHeaders"].split(";")
    canonical_headers = "".join("%s:%s\n" % (n, " ".join(h.get(n, "").split())) for n in signed)
    body = attempt.get("body", "").encode()
    canonical = "\n".join(["POST", "/" + attempt["path"], "", canonical_headers, ";".join(signed),
                           hashlib.sha256(body).hexdigest()])
    scope = "/".join([date, region, service, "aws4_request"])
    to_sign = "\n".join(["AWS4-HMAC-SHA256", h["x-amz-date"], scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + secret).encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    expected = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return {"seq": attempt["seq"], "ok": hmac.compare_digest(expected, fields["Signature"]), "signed": signed,
            "credential": fields["Credential"]}


def shaped(rec, secret):
    headers = {}
    for name, value in rec["headers"].items():
        if name.lower().startswith(PREFIX):
            try:
                value = base64.b64decode(value, validate=True).decode("utf-8")
            except ValueError:
                pass
            headers[name[len(PREFIX):]] = value
        elif name.lower().startswith("ce-"):
            headers["ce_" + name[3:].lower()] = value
        else:
            headers[name.lower()] = value
    out = {"subject": rec["topic"], "seq": rec["seq"], "data": rec["body"], "headers": headers,
           "message_id": rec["headers"].get("Idempotency-Key")}
    if secret:
        out["signature_ok"] = signature_ok(secret, rec["headers"], rec["body"])
    return out


def elements(rec, secret):
    """A batch request's records (see --batches); a request of one record as it is."""
    body = rec["body"]
    if not body.startswith("["):
        out = shaped(rec, secret)
        out["seq"] = rec["seq"] * 100000
        return [out]
    request = shaped(rec, secret)
    out = []
    for i, el in enumerate(json.loads(body)):
        one = {"subject": rec["topic"], "seq": rec["seq"] * 100000 + i}
        if isinstance(el, dict) and set(el) == {"id", "key", "headers", "value"}:
            headers = dict(el["headers"])
            if el["key"] is not None:
                headers["key"] = el["key"]
            one.update(data=json.dumps(el["value"]), headers=headers, message_id=el["id"])
        else:
            one.update(data=json.dumps(el), headers={}, message_id=request["message_id"])
        if secret:
            one["signature_ok"] = request["signature_ok"]
        out.append(one)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["read", "attempts", "fault", "delete", "sigv4"])
    p.add_argument("--store", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--count", type=int, default=0)
    p.add_argument("--timeout", type=float, default=60)
    p.add_argument("--secret")
    p.add_argument("--status", type=int)
    p.add_argument("--retry-after")
    p.add_argument("--match")
    p.add_argument("--delay-ms", type=int)
    p.add_argument("--min-size", type=int)
    p.add_argument("--reply")
    p.add_argument("--batches", action="store_true")
    a = p.parse_args()
    if a.command == "delete":
        for path in glob.glob(os.path.join(glob.escape(a.store), glob.escape(a.prefix) + "*.jsonl")):
            os.unlink(path)
        path = os.path.join(a.store, "faults.json")
        try:
            with open(path) as f:
                rules = [r for r in json.load(f) if not r["prefix"].startswith(a.prefix)]
            with open(path + ".tmp", "w") as f:
                json.dump(rules, f)
            os.replace(path + ".tmp", path)
        except (OSError, ValueError):
            pass
        return
    if a.command == "fault":
        path = os.path.join(a.store, "faults.json")
        try:
            with open(path) as f:
                rules = json.load(f)
        except (OSError, ValueError):
            rules = []
        rule = {"prefix": a.prefix, "status": a.status, "count": a.count if a.count else -1}
        for name in ("retry_after", "match", "delay_ms", "reply", "min_size"):
            if getattr(a, name) is not None:
                rule[name] = getattr(a, name)
        rules.append(rule)
        with open(path + ".tmp", "w") as f:
            json.dump(rules, f)
        os.replace(path + ".tmp", path)
        return
    if a.command == "attempts":
        for rec in load(a.store, a.prefix, ".attempts.jsonl"):
            print(json.dumps(rec))
        return
    if a.command == "sigv4":
        for rec in load(a.store, a.prefix, ".attempts.jsonl"):
            print(json.dumps(sigv4_check(rec, a.secret)))
        return
    def read_all():
        recs = load(a.store, a.prefix, ".jsonl")
        if not a.batches:
            return [shaped(rec, a.secret) for rec in recs]
        return [one for rec in recs for one in elements(rec, a.secret)]
    deadline = time.time() + a.timeout
    out = read_all()
    while len(out) < a.count and time.time() < deadline:
        time.sleep(0.2)
        out = read_all()
    for one in out:
        print(json.dumps(one))


if __name__ == "__main__":
    sys.exit(main())
