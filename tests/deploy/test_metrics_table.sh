#!/usr/bin/env bash
# docs/operations.md's "## Metrics" table lists exactly the metric families
# walrelay exports, with their types and labels: it is diffed against
# `walrelay --list-metrics`, which prints them from the registry the daemon
# serves /metrics from (src/admin/metrics.cpp). A metric missing from the table, one
# the table names that walrelay does not export, or a wrong type or label
# set fails.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
need python3 python3
bin=${WALRELAY_DEPLOY_BINARY:-}
[[ -n $bin && -x $bin ]] || skip "no walrelay binary (build it, or pass one to tests/deploy/run.sh)"
make_tmp
"$bin" --list-metrics > "$tmp/metrics.tsv" || fail "$bin --list-metrics failed"
ok "walrelay --list-metrics printed $(wc -l < "$tmp/metrics.tsv") families"
python3 - "$REPO/docs/operations.md" "$tmp/metrics.tsv" <<'PY'
import re, sys
doc, listing = sys.argv[1], sys.argv[2]
def fail(m): print("FAIL: " + m, file=sys.stderr); sys.exit(1)

exported = {}
for line in open(listing):
    name, kind, labels, _help = line.rstrip("\n").split("\t", 3)
    exported[name] = (kind, frozenset() if labels == "-" else frozenset(labels.split(",")))
if len(exported) < 40: fail(f"--list-metrics printed only {len(exported)} families")

text = open(doc).read()
m = re.search(r"^## Metrics\n(.*?)(?=^## )", text, re.S | re.M)
if not m: fail("docs/operations.md has no '## Metrics' section")
documented = {}
rows = [l for l in m.group(1).splitlines() if l.startswith("| `")]
for row in rows:
    cells = [c.strip() for c in row.strip().strip("|").split("|")]
    if len(cells) < 3: fail(f"a row of the metrics table has {len(cells)} cells: {row}")
    names = re.findall(r"`([a-z_:]+)(?:\{([a-z_,]*)\})?`", cells[0])
    if not names: fail(f"no metric name in the first cell of: {row}")
    for name, labels in names:
        if name in documented: fail(f"{name} is in the table twice")
        documented[name] = (cells[1], frozenset(l for l in labels.split(",") if l))

problems = []
for name, (kind, labels) in sorted(exported.items()):
    if name not in documented:
        problems.append(f"missing from the table: {name} ({kind}, labels {sorted(labels) or 'none'})")
        continue
    dkind, dlabels = documented[name]
    if dkind != kind: problems.append(f"{name}: the table says type '{dkind}', walrelay exports a {kind}")
    if dlabels != labels:
        problems.append(f"{name}: the table says labels {sorted(dlabels) or 'none'}, walrelay's are {sorted(labels) or 'none'}")
for name in sorted(set(documented) - set(exported)):
    problems.append(f"in the table but not exported by walrelay: {name}")
if problems: fail("docs/operations.md ## Metrics against walrelay --list-metrics:\n  " + "\n  ".join(problems))
print(f"ok: the metrics table lists the {len(exported)} families walrelay exports, types and labels alike")
PY
