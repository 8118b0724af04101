#!/usr/bin/env bash
# Relative links in the operator documentation point at files that exist and,
# with a #fragment, at a heading of that file (GitHub's anchor rules).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
need python3 python3
python3 - "$REPO" <<'PY'
import os, re, sys
repo = sys.argv[1]
docs = ["quickstart.md", "configuration.md", "benchmarks.md", "operations.md", "migration-from-debezium.md",
        "migration-from-polling.md", "architecture.md", "tableless-outbox.md"]
def anchors(path):
    out = set()
    in_code = False
    for line in open(path):
        if line.startswith("```"):
            in_code = not in_code
        if in_code: continue
        m = re.match(r"#+\s+(.*)", line)
        if m:
            a = m.group(1).strip().lower()
            a = re.sub(r"[^\w\- ]", "", a).replace(" ", "-")
            out.add(a)
    return out
bad = []
for d in docs:
    p = os.path.join(repo, "docs", d)
    if not os.path.exists(p):
        bad.append(f"docs/{d} missing"); continue
    text = open(p).read()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target): continue
        f, _, frag = target.partition("#")
        fp = os.path.normpath(os.path.join(os.path.dirname(p), f)) if f else p
        if not os.path.exists(fp):
            bad.append(f"{d}: {target}: no file"); continue
        if frag and fp.endswith(".md") and frag not in anchors(fp):
            bad.append(f"{d}: {target}: no heading #{frag}")
if bad:
    print("FAIL: " + "; ".join(bad), file=sys.stderr); sys.exit(1)
print(f"ok: links in {len(docs)} documents")
PY
