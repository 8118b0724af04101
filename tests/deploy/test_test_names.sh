#!/usr/bin/env bash
# Catch test names hold no ';' and no backslash: CMake's catch_discover_tests
# splits a name at each ';' into ctest entries that select no test, and a
# backslash (as in "a\, b") turns into an escape in the spec that selects
# none either. Each discovered test runs with --warn NoTests, so such a test
# fails in CI; this check names it before the suite runs.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
need python3 python3
python3 - "$REPO" <<'PY'
import glob, re, sys
bad = []
for path in sorted(glob.glob(sys.argv[1] + "/tests/**/*.cpp", recursive=True)):
    text = open(path, encoding="utf-8").read()
    for m in re.finditer(r'TEST_CASE(?:_METHOD\(\s*\w+\s*,|\()((?:\s*"(?:[^"\\]|\\.)*")+)', text):
        name = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1)))
        if ";" in name or "\\" in name:
            bad.append(f"{path[len(sys.argv[1]) + 1:]}: {name[:100]}")
if bad:
    print("FAIL: test names with ';' or a backslash (ctest would run nothing for them):\n  " + "\n  ".join(bad), file=sys.stderr)
    sys.exit(1)
print("ok: no test name has a ';' or a backslash")
PY
