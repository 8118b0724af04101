#!/usr/bin/env bash
# Every figure of docs/benchmarks.md and README.md traceable to a file of the
# run it names: each generated block (<!-- bench:NAME -->) names a results
# file, bench/results/<date>/<file>, and that file exists; the blocks are what
# bench/report.py makes of bench/results/latest (no figure typed by hand or
# left from another run); and pg_recvlogical is not called a ceiling.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
need python3 python3
make_tmp
cp "$REPO/docs/benchmarks.md" "$tmp/benchmarks.md"
cp "$REPO/README.md" "$tmp/README.md"
python3 "$REPO/bench/report.py" --update "$tmp/benchmarks.md" --update "$tmp/README.md" "$REPO/bench/results/latest" \
  || fail "bench/report.py failed on bench/results/latest"
diff -u "$REPO/docs/benchmarks.md" "$tmp/benchmarks.md" \
  || fail "docs/benchmarks.md is not what bench/report.py makes of bench/results/latest (bench/report.py --update docs/benchmarks.md --update README.md bench/results/latest)"
diff -u "$REPO/README.md" "$tmp/README.md" || fail "README.md's bench:headline is not what bench/report.py makes of bench/results/latest"
ok "the generated blocks are bench/report.py's, from bench/results/latest"

python3 - "$REPO" <<'PY'
import os, re, sys
repo = sys.argv[1]
def fail(m): print("FAIL: " + m, file=sys.stderr); sys.exit(1)
blocks = 0
for page in ("docs/benchmarks.md", "README.md"):
    text = open(os.path.join(repo, page)).read()
    for name, body in re.findall(r"<!-- bench:([a-z-]+) -->(.*?)<!-- /bench:\1 -->", text, re.S):
        blocks += 1
        named = re.findall(r"`(bench/results/[^/`]+/[^/`]*)`", body)
        for f in named:
            if not os.path.exists(os.path.join(repo, f)):
                fail(f"{page}, block {name}: {f} does not exist")
        files = [f for f in named if not f.endswith("/")]
        # the files table names each file by its name alone, in the folder the block names
        for f in re.findall(r"^\| `([^`/]+\.(?:json|csv))` \|", body, re.M):
            folder = next((n if n.endswith("/") else os.path.dirname(n) for n in named), None)
            if not folder or not os.path.isfile(os.path.join(repo, folder, f)):
                fail(f"{page}, block {name}: {f} is not a file of the folder it names ({folder})")
            files.append(f)
        if not files:
            fail(f"{page}, block {name}: names no results file (`bench/results/<date>/<file>`)")
if blocks < 15:
    fail(f"only {blocks} generated blocks found")
print(f"ok: each of the {blocks} generated blocks names results files that exist")
stale = []
for root in ("docs", "bench", "README.md"):
    paths = [os.path.join(repo, root)] if root.endswith(".md") else \
        [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(repo, root)) for f in fs
         if f.endswith((".md", ".py", ".sh")) and "/results/" not in d + "/"]
    for p in paths:
        t = open(p).read()
        for phrase in ("walsender's ceiling", "the walsender is the ceiling", "one run of one command"):
            if phrase in t:
                stale.append(f"{os.path.relpath(p, repo)}: {phrase}")
if stale:
    fail("claims the results do not support: " + "; ".join(stale))
print("ok: pg_recvlogical is a reference client, not a ceiling; no 'one run' claim")
PY
