#!/usr/bin/env bash
# Every metric the alert rules and the Grafana dashboard query is one walrelay
# exports (the walrelay_* names in include/walrelay/admin/metrics.hpp and
# src/admin/metrics.cpp, the process_* families) or Prometheus' own `up`; the
# dashboard is valid JSON with unique panel ids.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
need python3 python3
python3 - "$REPO" <<'PY'
import glob, json, os, re, sys, yaml
repo = sys.argv[1]
def fail(m): print("FAIL: " + m, file=sys.stderr); sys.exit(1)
known = set()
for f in ["include/walrelay/admin/metrics.hpp"] + glob.glob(os.path.join(repo, "src/admin/metrics.cpp")):
    p = os.path.join(repo, f)
    if os.path.exists(p):
        known |= set(re.findall(r"\bwalrelay_[a-z_]+\b", open(p).read()))
known |= {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_virtual_memory_bytes",
          "process_start_time_seconds", "process_open_fds", "process_max_fds", "up"}
if len(known) < 20: fail(f"found only {len(known)} metric names in metrics.hpp/metrics.cpp")
def used(expr):
    e = re.sub(r'"[^"]*"', '""', expr)        # label values
    e = re.sub(r"\{[^}]*\}", "", e)             # selectors
    e = re.sub(r"\[[^\]]*\]", "", e)            # ranges
    names = set(re.findall(r"\b(walrelay_[a-z_]+|process_[a-z_]+|up)\b", e))
    return names
exprs = []
for g in yaml.safe_load(open(os.path.join(repo, "deploy/prometheus/walrelay-alerts.yml")))["groups"]:
    exprs += [("alert " + r["alert"], r["expr"]) for r in g["rules"]]
d = json.load(open(os.path.join(repo, "deploy/grafana/walrelay-dashboard.json")))
ids = [p["id"] for p in d["panels"]]
if len(ids) != len(set(ids)): fail("duplicate panel ids")
for p in d["panels"]:
    for t in p.get("targets", []):
        exprs.append(("panel " + p["title"], t["expr"]))
unknown = [(w, n) for w, e in exprs for n in used(e) if n not in known]
if unknown: fail("unknown metrics: " + ", ".join(f"{n} ({w})" for w, n in unknown))
print(f"ok: {len(exprs)} expressions use only exported metrics")
PY
