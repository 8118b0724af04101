#!/usr/bin/env python3
"""Checks Kafka records (as kcat -J prints them, one JSON object a line, read
from stdin) against the CloudEvents 1.0 schema beside this file, in the mode
given: structured (the value is the event) or binary (the ce_* headers are
the attributes, the value the data). Prints one line per record and exits 1
if any fails. jsonschema is Debian's python3-jsonschema."""
import base64
import json
import sys

import jsonschema

mode = sys.argv[1]
schema = json.load(open(sys.argv[2]))
validator = jsonschema.Draft7Validator(schema, format_checker=jsonschema.FormatChecker())
bad = 0
for line in sys.stdin:
    if not line.strip():
        continue
    rec = json.loads(line)
    if mode == "structured":
        event = json.loads(rec["payload"])
        headers = dict(zip(rec.get("headers", [])[::2], rec.get("headers", [])[1::2]))
        if not headers.get("content-type", "").startswith("application/cloudevents+json"):
            print(f"FAIL offset {rec['offset']}: content-type {headers.get('content-type')!r}")
            bad += 1
    else:
        hs = rec.get("headers", [])
        headers = dict(zip(hs[::2], hs[1::2]))
        event = {k[3:]: v for k, v in headers.items() if k.startswith("ce_")}
        if "content-type" in headers:
            event["datacontenttype"] = headers["content-type"]
        if rec.get("payload") is not None:
            event["data"] = rec["payload"]
    errors = sorted(validator.iter_errors(event), key=str)
    for e in errors:
        print(f"FAIL offset {rec['offset']}: {e.message} at {list(e.absolute_path)}")
    bad += bool(errors)
    if not errors:
        print(f"ok offset {rec['offset']}: " + json.dumps({k: event.get(k) for k in ("id", "type", "source", "subject", "time", "datacontenttype")}))
        if "data_base64" in event:
            base64.b64decode(event["data_base64"], validate=True)
sys.exit(1 if bad else 0)
