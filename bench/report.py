#!/usr/bin/env python3
"""The Markdown tables of one bench run, for docs/benchmarks.md and README.md.

  bench/report.py bench/results/latest                    the tables, on stdout
  bench/report.py --update docs/benchmarks.md [--readme README.md] bench/results/latest
      rewrites the part of each file between its `<!-- bench:... -->` markers

Every figure comes from the folder's files (full.json, decoder.json); a
section the run did not hold says so instead of a number.
"""
import argparse
import json
import os
import re
import statistics

ORDER = ["pg_recvlogical", "walrelay", "debezium", "polling"]


def append_ms(rs, k):
    """An insert -> log append percentile: the broker's LogAppendTime has
    millisecond resolution, so what is under 1 ms is shown as such."""
    m, text = med(rs, k)
    if m is None:
        return text
    return "< 1" if m < 1 else text


def med(rs, k):
    vals = [r[k] for r in rs if r.get(k) is not None]
    if not vals:
        return None, "–"
    m = statistics.median(vals)

    def f(v):
        return f"{v:,.0f}" if abs(v) >= 100 else (f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}")
    if len(vals) == 1:
        return m, f(m)
    return m, f"{f(m)} ({f(min(vals))}–{f(max(vals))})"


def by(runs, *keys):
    g = {}
    for r in runs:
        g.setdefault(tuple(r[k] for k in keys), []).append(r)
    return g


def throughput(data):
    cols = [("total_events_per_s", "events/s launch→last ack"), ("events_per_s", "events/s first→last ack"),
            ("startup_s", "start-up s"), ("cpu_us_per_event", "relay CPU µs/event"),
            ("peak_rss_mib", "peak RSS MiB"), ("pg_backend_cpu_us_per_event", "walsender/backend CPU µs/event"),
            ("broker_cpu_us_per_event", "broker CPU µs/event"), ("machine_busy_cores", "machine busy cores"),
            ("other_busy_cores", "of which others")]
    g = by(data["runs"], "workload", "contender")
    out = []
    for w in dict.fromkeys(r["workload"] for r in data["runs"]):
        out.append(f"\n**{w}**\n")
        out.append("| contender | " + " | ".join(c[1] for c in cols) + " |")
        out.append("|---" * (len(cols) + 1) + "|")
        for c in ORDER:
            rs = g.get((w, c))
            if rs:
                out.append(f"| {c} (n={len(rs)}) | " + " | ".join(med(rs, k)[1] for k, _ in cols) + " |")
    return "\n".join(out)


def targets(data):
    g = by(data["runs"], "workload", "contender")
    out = ["| workload | target | measured (medians) | met? |", "|---|---|---|---|"]
    for w in dict.fromkeys(r["workload"] for r in data["runs"]):
        def m(c, k):
            return med(g.get((w, c), []), k)[0]
        wr, rl, dz = m("walrelay", "total_events_per_s"), m("pg_recvlogical", "total_events_per_s"), \
            m("debezium", "total_events_per_s")
        wr_f = m("walrelay", "events_per_s")
        if wr and rl:
            out.append(f"| {w} | walrelay ≥ 0.9× pg_recvlogical throughput | {wr / rl:.2f}× launch→last "
                       f"({wr_f / rl:.2f}× first→last) | {'yes' if wr / rl >= 0.9 else 'no'} |")
        if wr and dz:
            out.append(f"| {w} | ≥ 4× Debezium throughput | {wr / dz:.1f}× | {'yes' if wr / dz >= 4 else 'no'} |")
        for k, label, need in (("cpu_us_per_event", "≤ 1/10 Debezium CPU per event", 10),
                               ("peak_rss_mib", "≤ 1/20 Debezium peak memory", 20),
                               ("startup_s", "start-up ≥ 50× faster than Debezium", 50)):
            a, b = m("walrelay", k), m("debezium", k)
            if a and b:
                out.append(f"| {w} | {label} | 1/{b / a:.1f} | {'yes' if b / a >= need else 'no'} |")
    return "\n".join(out)


def pg_load(data):
    g = by(data["runs"], "workload", "contender")
    out = ["| workload | contender | outbox statements (calls) | their exec ms | other statements (calls) | "
           "outbox seq scans | idx scans | rows updated | rows deleted |", "|---" * 9 + "|"]
    for (w, c), rs in g.items():
        def mm(f):
            vals = [f(r["pg_load"]) for r in rs]
            return f"{statistics.median(vals):,.0f}"
        out.append(f"| {w} | {c} | {mm(lambda p: p['outbox_statement_calls'])} | "
                   f"{mm(lambda p: p['outbox_statement_exec_ms'])} | {mm(lambda p: p['other_statement_calls'])} | "
                   f"{mm(lambda p: p['outbox_table'].get('seq_scan', 0))} | "
                   f"{mm(lambda p: p['outbox_table'].get('idx_scan', 0))} | "
                   f"{mm(lambda p: p['outbox_table'].get('n_tup_upd', 0))} | "
                   f"{mm(lambda p: p['outbox_table'].get('n_tup_del', 0))} |")
    stmts = {}
    for r in data["runs"]:
        for s in r["pg_load"]["outbox_statements"]:
            stmts.setdefault((r["contender"], s["query"]), s)
    out.append("\nStatements touching the outbox (one run each):\n")
    for (c, q), s in stmts.items():
        out.append(f"- {c}: `{q}` — {s['calls']:,} calls, {s['total_exec_ms']:,} ms")
    return "\n".join(out)


def options(data):
    g = by(data.get("option_runs", []), "contender", "options")
    out = ["| reader | options | events/s launch→last | walsender CPU µs/event | reader CPU µs/event |",
           "|---|---|---|---|---|"]
    for (c, o), rs in g.items():
        out.append(f"| {c} | {o} | {med(rs, 'total_events_per_s')[1]} | "
                   f"{med(rs, 'pg_backend_cpu_us_per_event')[1]} | {med(rs, 'cpu_us_per_event')[1]} |")
    return "\n".join(out)


def latency(data):
    """Median (min–max) over the repeats of each contender and rate."""
    out = ["| contender | offered rate | achieved | events received | append p50 | p99 | p99.9 | max | "
           "walrelay's own commit→ack p99 ≤ | consumer p50 | p99 |", "|---" * 11 + "|"]
    rows = data.get("latency", []) + data.get("latency_ladder", []) + data.get("latency_extra", [])
    groups = {}
    for r in rows:
        name = r["contender"] + (f" ({r['options']})" if r.get("options") else "")
        groups.setdefault((name, r["rate"]), []).append(r)
    for (name, rate), rs in groups.items():
        n = f" (n={len(rs)})" if len(rs) > 1 else ""
        got = sum(r["received"] for r in rs)
        want = sum(r["events"] for r in rs)
        self_p99 = med(rs, "self_commit_to_ack_p99_le_ms")[1]
        out.append(f"| {name}{n} | {rate:,}/s | {med(rs, 'offered_events_per_s')[1]}/s | {got:,}/{want:,} | "
                   f"{append_ms(rs, 'append_p50_ms')} | {append_ms(rs, 'append_p99_ms')} | "
                   f"{append_ms(rs, 'append_p99.9_ms')} | {append_ms(rs, 'append_max_ms')} | {self_p99} | "
                   f"{med(rs, 'consumer_p50_ms')[1]} | {med(rs, 'consumer_p99_ms')[1]} |")
    return "\n".join(out)


def fmt(v, unit=""):
    if v is None:
        return "–"
    s = f"{v:,.0f}" if abs(v) >= 100 else (f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}")
    return s + unit


# --- where each table comes from ---------------------------------------------
# Every generated block names its results file and that file's run: when it
# ran, what was run, on which machine, with which walrelay binaries and
# builds, as far as the file records them (bench/provenance.py writes all of
# it from now on; older files lack the host name, the build type and the
# commit, and the block says so). tests/deploy/test_bench_provenance.sh checks
# that each block names a file that exists.

# bench.py's options that only wire it to the services and folders.
PLUMBING = {"--pgport", "--kafka", "--kafka-pid", "--kafka-version", "--out", "--work", "--pg-recvlogical",
            "--debezium-dir", "--registry", "--nats", "--rabbitmq", "--walrelay", "--variant"}


def command(d):
    argv, extra, i = d.get("argv", []), [], 0
    while i < len(argv):
        if argv[i] in PLUMBING:
            i += 2
            continue
        extra.append(argv[i])
        i += 1
    return "`bench/run.sh`, the full run" if not extra else f"the harness with `{' '.join(extra)}`"


def build_text(path, version, info=None):
    """One walrelay binary: its path, version, build type and commit, or what the file does not say."""
    if info:
        bt = info.get("build_type") or "build type not recorded"
        commit = info.get("commit") or "commit not recorded"
        return f"`{path}` ({version}; {bt}, commit {commit})"
    if re.search(r"/build-bench(-[^/]*)?/walrelay$", path):
        how = ("Release, as `bench/run.sh` configures the folder it builds in; the file records no build type or "
               "commit")
    elif path.endswith("/build/walrelay"):
        how = ("RelWithDebInfo, as `scripts/build.sh` configures `build/`; the file records no build type or "
               "commit")
    else:
        how = "a copy outside a build directory: its build type and commit are not recorded"
    return f"`{path}` ({version}; {how})"


def binaries(d):
    """The walrelay binaries a bench.py file ran: --walrelay and each --variant."""
    argv, v = d.get("argv", []), d.get("versions", {})
    builds = v.get("builds", {})
    variants = [argv[i + 1].split("=", 1) for i, a in enumerate(argv[:-1]) if a == "--variant"]
    out = [f"{name}: " + build_text(path, v.get("variants", {}).get(name, "?"), builds.get(name))
           for name, path in variants]
    if "--walrelay" in argv:
        path = argv[argv.index("--walrelay") + 1]
        if path not in [p for _, p in variants]:
            out.insert(0, build_text(path, v.get("walrelay", "?"), builds.get("walrelay")))
    return out


def machine_text(m):
    s = f"{m.get('nproc', '?')} cores `{m.get('cpu_model', '?')}`, {m.get('mem_gib', '?')} GiB, Linux {m.get('kernel', '?')}"
    return s + (f", host `{m['hostname']}`" if m.get("hostname") else " (host name not recorded)")


def run_line(d, fname, folder):
    """The whole provenance of a file that is not the full run's."""
    return (f"Run: `bench/results/{folder}/{fname}`, {d.get('started', '?')} to {d.get('finished', 'not finished')}, "
            f"{command(d)}; {machine_text(d.get('machine', {}))}; walrelay " + "; ".join(binaries(d)) + ".")


def full_line(data, folder, what=""):
    """A block from the full run: its file and span; the machine and builds are in the run's table."""
    return (f"From `bench/results/{folder}/full.json`{what}: `bench/run.sh`'s full run, {data.get('started', '?')} to "
            f"{data.get('finished', 'not finished')} (machine and builds: [the run](#the-run)).")


def header(data, folder):
    m, v = data["machine"], data["versions"]
    started, finished = data.get("started", "?"), data.get("finished", "not finished")
    rows = [("run", f"`bench/run.sh`, {started} to {finished}, results in `bench/results/{folder}/full.json`"),
            ("CPU", f"{m['nproc']} cores, `{m['cpu_model']}`"), ("memory", f"{m['mem_gib']} GiB"),
            ("kernel", f"Linux {m['kernel']}"), ("host", m.get("hostname") or "not recorded"), ("load average at the start", ", ".join(f"{x:.2f}" for x in m.get("loadavg_at_start", []))),
            ("PostgreSQL", v.get("postgresql", "?")), ("Kafka", f"{v.get('kafka', '?')}, one KRaft broker"),
            ("walrelay", v.get("walrelay", "?") + f", built by {v.get('compiler', '?')}")]
    for b in binaries(data):
        rows.append(("walrelay binary", b))
    if "debezium" in v:
        rows.append(("Debezium", f"{v['debezium']} embedded engine, {v.get('java', '')}"))
    rows.append(("harness, polling relay and txn floor", v.get("kafka_clients_python", "?")))
    return "| | |\n|---|---|\n" + "\n".join(f"| {a} | {b} |" for a, b in rows)


def librdkafka_goals(data):
    """#26's goals, per variant, medians over the interleaved rounds."""
    g = by(data.get("librdkafka", []), "kind", "variant")
    if not g:
        return "_This run has no librdkafka section._"
    variants = list(dict.fromkeys(r["variant"] for r in data["librdkafka"] if r["kind"] != "floor"))
    floor = g.get(("floor", "txn producer alone"), [])

    def m(kind, v, key):
        return med(g.get((kind, v), []), key)

    out = ["| goal | " + " | ".join(variants) + " | txn producer alone |", "|---" * (len(variants) + 2) + "|"]

    def row(label, kind, key, goal=None, floor_key=None, unit=""):
        cells = []
        for v in variants:
            val, text = m(kind, v, key)
            ok = "" if goal is None or val is None else (" ✓" if goal(val) else " ✗")
            cells.append(text + unit + ok)
        f = med(floor, floor_key)[1] + unit if floor_key else "–"
        out.append(f"| {label} | " + " | ".join(cells) + f" | {f} |")

    row("exactly once, insert → visible (read_committed) p99, 1,000 one-row tx/s, 10 ms boundary: under 25 ms",
        "eos_1000", "consumer_p99_ms", lambda x: x < 25, "consumer_p99_ms", " ms")
    row("the same, p50", "eos_1000", "consumer_p50_ms", None, "consumer_p50_ms", " ms")
    row("the same, p99.9", "eos_1000", "consumer_p99.9_ms", None, "consumer_p99.9_ms", " ms")
    row("exactly once, walrelay CPU per event at 1,000 tx/s", "eos_1000", "relay_cpu_us_per_event", None,
        "bench_process_cpu_us_per_event", " µs")
    # throughput: exactly once / at least once, per round (same WAL, same round),
    # from launch (start-up included) and from the first record in Kafka
    def ratio_cells(rate_of):
        cells = []
        for v in variants:
            alo = {r["round"]: rate_of(r) for r in g.get(("throughput_alo", v), [])}
            eos = {r["round"]: rate_of(r) for r in g.get(("throughput_eos", v), [])}
            ratios = [eos[k] / alo[k] for k in alo if alo[k] and eos.get(k)]
            if ratios:
                rm = statistics.median(ratios)
                cells.append(f"{rm:.2f} ({min(ratios):.2f}–{max(ratios):.2f})" + (" ✓" if rm >= 0.9 else " ✗"))
            else:
                cells.append("–")
        return cells

    def from_first(r):
        t, s0 = r.get("launch_to_slot_confirmed_s"), r.get("startup_s")
        return r["events"] / (t - s0) if t and s0 is not None and t > s0 else None
    out.append("| exactly-once throughput at 100-row transactions, as a share of at-least-once's (same WAL, "
               "launch → slot confirmed at the end): at least 0.9 (#42) | "
               + " | ".join(ratio_cells(lambda r: r.get("confirmed_events_per_s"))) + " | – |")
    out.append("| the same from the first record in Kafka → slot confirmed (start-up left out) | "
               + " | ".join(ratio_cells(from_first)) + " | – |")
    row("start-up: launch → first record in Kafka, exactly once", "throughput_eos", "startup_s", None, None, " s")
    row("start-up: launch → first record in Kafka, at least once", "throughput_alo", "startup_s", None, None, " s")
    for mode, label in (("alo", "at least once"), ("eos", "exactly once")):
        row(f"{label}: events/s, 200,000 events in 100-row transactions, launch → slot confirmed",
            f"throughput_{mode}", "confirmed_events_per_s")
    row("idle CPU, at least once (20 s, no writes): at most 0.3 ms/s", "alo_1000", "idle_relay_cpu_ms_per_s",
        lambda x: x <= 0.3, None, " ms/s")
    row("idle CPU, exactly once (20 s, no writes)", "eos_1000", "idle_relay_cpu_ms_per_s", None, None, " ms/s")
    row("at least once: CPU per lone event at 1,000 one-row tx/s", "alo_1000", "relay_cpu_us_per_event",
        None, None, " µs")
    row("at least once: insert → log append p99 at 1,000/s", "alo_1000", "append_p99_ms", None, None, " ms")
    n = len({r["round"] for r in data["librdkafka"]})
    out.append(f"\nMedians over {n} interleaved rounds (min–max in parentheses); ✓/✗: the goal met or not.")
    return "\n".join(out)


def decoder(folder):
    path = os.path.join(folder, "decoder.json")
    if not os.path.exists(path):
        return "_This run has no decoder.json._"
    d = json.load(open(path))
    out = ["| benchmark | time per message (median of 5) | rate | heap allocations per message |",
           "|---|---|---|---|"]
    for b in d["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        name = b["run_name"]
        t = b["real_time"] * {"ns": 1, "us": 1e3, "ms": 1e6}[b["time_unit"]]
        rate = b.get("items_per_second")
        out.append(f"| `{name}` | {t:,.1f} ns | {rate / 1e6:,.1f} M/s | {b.get('allocs_per_msg', 0):.0f} |"
                   if rate else f"| `{name}` | {t:,.1f} ns | – | {b.get('allocs_per_msg', 0):.0f} |")
    ctx = d.get("context", {})
    exe = ctx.get("executable", "?")
    if ctx.get("build_type"):
        build = f"{ctx['build_type']}, commit {ctx.get('walrelay_commit', 'not recorded')}"
    elif re.search(r"/build-bench/bench/decoder_bench$", exe):
        build = ("Release (`-O3`), as `bench/run.sh` configures the folder it builds in; the file records no build "
                 "type or commit")
    else:
        build = "build type and commit not recorded"
    out.append(f"\nRun: `bench/results/{os.path.basename(os.path.normpath(os.path.realpath(folder)))}/decoder.json`, "
               f"{ctx.get('date', '?')}, `bench/run.sh`'s full run before its services started; host "
               f"`{ctx.get('host_name', '?')}`, one core (`taskset -c 1`) of {ctx.get('num_cpus', '?')} at "
               f"{ctx.get('mhz_per_cpu', '?')} MHz; `{exe}` ({build}). Google Benchmark reports its own library as "
               f"built `{ctx.get('library_build_type', '?')}`, which does not touch the measured code.")
    return "\n".join(out)


def sidecar(data):
    rows = data.get("sidecar", [])
    if not rows:
        return "_This run has no sidecar section._"
    out = ["| contender | rate | CPU µs/event | its walsender/backends µs/event | pg_recvlogical beside, µs/event | "
           "idle CPU ms/s | append p50 | p99 | events received |", "|---" * 9 + "|"]
    g = {}
    for r in rows:
        g.setdefault((r["contender"], r["rate"]), []).append(r)
    for (c, rate), rs in sorted(g.items(), key=lambda kv: (ORDER.index(kv[0][0]), kv[0][1])):
        got, want = sum(r["received"] for r in rs), sum(r["events"] for r in rs)
        out.append(f"| {c} | {rate:,}/s | {med(rs, 'relay_cpu_us_per_event')[1]} | "
                   f"{med(rs, 'relay_server_cpu_us_per_event')[1]} | {med(rs, 'recvlogical_cpu_us_per_event')[1]} | "
                   f"{med(rs, 'idle_relay_cpu_ms_per_s')[1]} | {append_ms(rs, 'append_p50_ms')} | "
                   f"{append_ms(rs, 'append_p99_ms')} | {got:,}/{want:,} |")
    return "\n".join(out)


def tableless(data):
    rows = data.get("tableless", [])
    if not rows:
        return "_This run has no tableless section._"
    out = ["| side | events as | WAL bytes/event | commit p50 ms | p99 ms | table left | clean-up s | "
           "clean-up WAL bytes/event | walrelay events/s | walsender CPU µs/event |", "|---" * 10 + "|"]
    for side in ("writer", "relay"):
        for kind in ("table", "message"):
            rs = [r for r in rows if r.get("side") == side and r.get("kind") == kind]
            if not rs:
                continue
            if side == "writer":
                out.append(f"| writer | {kind} | {med(rs, 'wal_bytes_per_event')[1]} | {med(rs, 'commit_p50_ms')[1]} | "
                           f"{med(rs, 'commit_p99_ms')[1]} | {med(rs, 'table_bytes_after')[1]} B | "
                           f"{med(rs, 'cleanup_s')[1]} | {med(rs, 'cleanup_wal_bytes_per_event')[1]} | – | – |")
            else:
                out.append(f"| relay | {kind} | – | – | – | – | – | – | {med(rs, 'total_events_per_s')[1]} | "
                           f"{med(rs, 'pg_backend_cpu_us_per_event')[1]} |")
    return "\n".join(out)


def eos_throughput(folder):
    """The explicit eos-throughput runs beside the full run (eos-throughput*.json), one row per file."""
    import glob
    files = sorted(glob.glob(os.path.join(folder, "eos-throughput*.json")))
    if not files:
        return "_No eos-throughput run in this folder._"
    out = ["| file | settings | build | at least once, events/s | exactly once, events/s | share, per round | "
           "CPU µs/event (alo, eos) |", "|---" * 7 + "|"]
    for f in files:
        d = json.load(open(f))
        rows = d.get("eos_throughput", [])
        argv = d.get("argv", [])
        setting = argv[argv.index("--walrelay-set") + 1] if "--walrelay-set" in argv else "defaults"
        for v in dict.fromkeys(r["variant"] for r in rows):
            alo = {r["round"]: r for r in rows if r["variant"] == v and r["kind"] == "throughput_alo"}
            eos = {r["round"]: r for r in rows if r["variant"] == v and r["kind"] == "throughput_eos"}
            shares = [eos[k]["first_to_confirmed_events_per_s"] / alo[k]["first_to_confirmed_events_per_s"]
                      for k in alo if k in eos and alo[k].get("first_to_confirmed_events_per_s")
                      and eos[k].get("first_to_confirmed_events_per_s")]
            out.append(f"| `{os.path.basename(f)}` | {setting} | {v} | "
                       f"{med(list(alo.values()), 'first_to_confirmed_events_per_s')[1]} | "
                       f"{med(list(eos.values()), 'first_to_confirmed_events_per_s')[1]} | "
                       + ", ".join(f"{x:.2f}" for x in shares) + " | "
                       f"{med(list(alo.values()), 'cpu_us_per_event')[1]}, {med(list(eos.values()), 'cpu_us_per_event')[1]} |")
    out.append("")
    folder_name = os.path.basename(os.path.normpath(os.path.realpath(folder)))
    out += [run_line(json.load(open(f)), os.path.basename(f), folder_name) for f in files]
    return "\n\n".join(["\n".join(out[:out.index("")])] + out[out.index("") + 1:])


def section_rows(data, folder, name):
    """A section's rows, its file and the run they belong to: the full run's, or
    those of an explicit `--only NAME` run's file (NAME.json) beside it."""
    rows = data.get(name, [])
    path = os.path.join(folder, f"{name}.json")
    if not rows and os.path.exists(path):
        d = json.load(open(path))
        return d.get(name, []), f"{name}.json", d
    return rows, "full.json", data


def source_line(data, source, folder):
    name = os.path.basename(os.path.normpath(os.path.realpath(folder)))
    return full_line(data, name) if source == "full.json" else run_line(data, source, name)


def formats(data, folder):
    """Text against each schema-registry format, one WAL per round: the full run's
    section, or an explicit `--only formats` run's file (formats.json) beside it."""
    rows, source, data = section_rows(data, folder, "formats")
    if not rows:
        return "_No formats run in this folder._"
    g = by(rows, "format")
    base = med(g.get(("string",), []), "events_per_s")[0]
    reg = data.get("versions", {}).get("schema_registry", "?")
    out = [source_line(data, source, folder) + f" Registry: {reg}; 200,000 events in 100-row transactions, ~220-byte JSON payloads, "
           "medians of the rounds.", "",
           "| value | events/s | share of text | CPU µs/event | peak RSS MiB |", "|---|---|---|---|---|"]
    names = {"string": "text (`StringConverter`)", "avro": "Avro", "json-schema": "JSON Schema (validated)",
             "protobuf": "Protobuf"}
    for fmt in ("string", "avro", "json-schema", "protobuf"):
        rs = g.get((fmt,), [])
        if not rs:
            continue
        rate = med(rs, "events_per_s")[0]
        share = f"{rate / base:.2f}" if rate and base else "–"
        out.append(f"| {names[fmt]} | {med(rs, 'events_per_s')[1]} | {share} | {med(rs, 'cpu_us_per_event')[1]} | "
                   f"{med(rs, 'peak_rss_mib')[1]} |")
    return "\n".join(out)


def snapshot(data, folder):
    """The initial snapshot against streaming on the same rows: the full run's
    section, or an explicit `--only snapshot` run's file (snapshot.json) beside it."""
    rows, source, data = section_rows(data, folder, "snapshot")
    if not rows:
        return "_No snapshot run in this folder._"
    g = by(rows, "kind")
    base = med(g.get(("streaming",), []), "events_per_s")[0]
    n = rows[0].get("events")
    out = [source_line(data, source, folder) + f" {n:,} rows written in 100-row transactions, medians of {len(g.get(('snapshot',), []))} "
           "rounds.", "",
           "| read by | rows/s (first to last record) | share of streaming | start-up s | CPU µs/row | peak RSS MiB |",
           "|---|---|---|---|---|---|"]
    names = {"streaming": "the stream (the slot made before the rows)",
             "snapshot": "the initial snapshot (`snapshot.mode=initial`, the slot made after them)"}
    for kind in ("streaming", "snapshot"):
        rs = g.get((kind,), [])
        if not rs:
            continue
        rate = med(rs, "events_per_s")[0]
        share = f"{rate / base:.2f}" if rate and base else "–"
        out.append(f"| {names[kind]} | {med(rs, 'events_per_s')[1]} | {share} | {med(rs, 'startup_s')[1]} | "
                   f"{med(rs, 'cpu_us_per_event')[1]} | {med(rs, 'peak_rss_mib')[1]} |")
    return "\n".join(out)


def sinks(data, folder):
    """Kafka, NATS JetStream, RabbitMQ, Redis, HTTP and SQS from one WAL per round: the full run's
    section, or an explicit `--only sinks` run's file (sinks.json) beside it."""
    rows, source, data = section_rows(data, folder, "sinks")
    if not rows:
        return "_No sinks run in this folder._"
    g = by(rows, "sink")
    base = med(g.get(("kafka",), []), "events_per_s")[0]
    v = data.get("versions", {})
    out = [source_line(data, source, folder) + f" nats-server {v.get('nats_server', '?')}, nats.c {v.get('nats_c', '?')}; RabbitMQ "
           f"{v.get('rabbitmq', '?')}, rabbitmq-c {v.get('rabbitmq_c', '?')}"
           + (f"; Redis {v.get('redis', '?')}, hiredis {v.get('hiredis', '?')}" if ("redis",) in g else "")
           + ("; HTTP: the tests' receiver (Python's standard library, each request appended to a file and flushed "
              "before its 200), batches of up to 200" if ("http",) in g else "")
           + ("; SQS: ElasticMQ 1.6.14 (persisted in H2), FIFO queues" if ("sqs",) in g else "")
           + "; 300,000 events in 100-row transactions "
           "from one WAL, each broker on this machine, medians of the rounds; each run from walrelay's launch to the "
           "slot confirmed past the last event (walrelay confirms only what the broker acknowledged; status updates "
           "every 100 ms).", "",
           "| sink | events/s | share of Kafka | walrelay CPU µs/event | broker CPU µs/event | peak RSS MiB |",
           "|---|---|---|---|---|---|"]
    for sink in ("kafka", "nats-jetstream", "rabbitmq", "redis", "http", "sqs"):
        rs = g.get((sink,), [])
        if not rs:
            continue
        rate = med(rs, "events_per_s")[0]
        share = f"{rate / base:.2f}" if rate and base else "–"
        out.append(f"| {sink} | {med(rs, 'events_per_s')[1]} | {share} | {med(rs, 'cpu_us_per_event')[1]} | "
                   f"{med(rs, 'broker_cpu_us_per_event')[1]} | {med(rs, 'peak_rss_mib')[1]} |")
    tools = data.get("sinks_broker_tools", {})
    if tools:
        out.append("")
        parts = []
        for key, sink, name in (("nats_bench_msgs_per_s", "nats-jetstream", "`nats bench js pub async --dedup`"),
                                ("rabbitmq_perftest_msgs_per_s", "rabbitmq", "RabbitMQ PerfTest (persistent, confirms)"),
                                ("redis_benchmark_xadd_per_s", "redis", "`redis-benchmark` XADD (one connection, 16 pipelined)"),
                                ("http_curl_events_per_s", "http", "curl -Z POSTing arrays of 200 values (16 at once) to the receiver"),
                                ("sqs_boto3_msgs_per_s", "sqs", "boto3 SendMessageBatch of 10 (16 threads) to ElasticMQ")):
            if tools.get(key):
                rate = med(g.get((sink,), []), "events_per_s")[0]
                share = f", walrelay at {rate / tools[key]:.2f} of it" if rate else ""
                parts.append(f"{name}: {tools[key]:,} messages/s{share}")
        out.append("The brokers' own tools, alone on the machine, publishing the same way: " + "; ".join(parts) + ".")
    return "\n".join(out)


def idle_threads(folder):
    """bench/idle_threads.py's files in the folder (idle-threads*.json): CPU per thread of an idle walrelay."""
    import glob
    files = sorted(glob.glob(os.path.join(folder, "idle-threads*.json")))
    if not files:
        return "_No idle_threads.py run in this folder._"
    out = ["| file | build | settings | total ms/s (µs/event) | per thread: ms/s (wake-ups/s), or µs/event "
           "(wake-ups/event) |", "|---|---|---|---|---|"]
    notes = []
    folder_name = os.path.basename(os.path.normpath(os.path.realpath(folder)))
    for f in files:
        d = json.load(open(f))
        if isinstance(d, list):
            # Written before idle_threads.py recorded where and with what it ran.
            paths = ", ".join(f"`{r['binary']}`" for r in d if r.get("binary"))
            notes.append(f"Run: `bench/results/{folder_name}/{os.path.basename(f)}` records no date, machine, version "
                         f"or build, only the binaries it ran: {paths} (copies outside a build directory).")
        else:
            builds = d.get("builds", {})
            notes.append(f"Run: `bench/results/{folder_name}/{os.path.basename(f)}`, {d.get('started', '?')} to "
                         f"{d.get('finished', '?')}, `bench/idle_threads.py`; {machine_text(d.get('machine', {}))}; "
                         + "; ".join(f"{n}: " + build_text(b.get('path', '?'), b.get('version', '?'), b)
                                     for n, b in builds.items()) + ".")
            d = d.get("runs", [])
        for r in d:
            settings = " ".join(r["settings"]) or "defaults"
            if r.get("rate"):
                # --rate: one-row transactions while measuring; per event, not per second.
                threads = ", ".join(f"{t} {v['cpu_us_per_event']:.2f} µs ({v['wakeups_per_event']:.2f})"
                                    for t, v in r["threads"].items())
                out.append(f"| `{os.path.basename(f)}` | {r['build']} | {settings}, {r['rate']:,.0f} one-row "
                           f"transactions/s ({r['events']:,} events): per event | {r['cpu_us_per_event']:.1f} µs | "
                           f"{threads} |")
                continue
            threads = ", ".join(f"{t} {v['cpu_ms_per_s']:.3f} ({v['wakeups_per_s']:.1f})" for t, v in r["threads"].items())
            out.append(f"| `{os.path.basename(f)}` | {r['build']} | {settings} | "
                       f"{r['cpu_ms_per_s']:.3f} | {threads} |")
    return "\n\n".join(["\n".join(out)] + notes)


def readme_headline(data, folder):
    """The figures README.md quotes, each with its conditions, its file and its table."""
    g = by(data.get("runs", []), "workload", "contender")
    src = f"`bench/results/{folder}/full.json`"

    def m(w, c, k):
        return med(g.get((w, c), []), k)[0]
    lines = []
    w = "1M_tx100"
    wr, rl, dz = m(w, "walrelay", "total_events_per_s"), m(w, "pg_recvlogical", "total_events_per_s"), \
        m(w, "debezium", "total_events_per_s")
    if wr and rl and dz:
        cpu_ratio = m(w, "debezium", "cpu_us_per_event") / m(w, "walrelay", "cpu_us_per_event")
        rss = m(w, "walrelay", "peak_rss_mib")
        n = len(g.get((w, "walrelay"), []))
        lines.append(f"1,000,000 events in 100-row transactions, medians of {n} rounds: {wr / rl:.2f}× the throughput "
                     f"of `pg_recvlogical` (a reference client reading the same WAL, `proto_version` 1) and "
                     f"{wr / dz:.1f}× Debezium's at 1/{cpu_ratio:.0f} of its CPU per event and "
                     f"1/{m(w, 'debezium', 'peak_rss_mib') / rss:.0f} of its memory ({rss:.0f} MiB); the first event "
                     f"in Kafka {m(w, 'walrelay', 'startup_s') * 1000:.0f} ms after start (Debezium: "
                     f"{m(w, 'debezium', 'startup_s'):.1f} s) ([throughput](docs/benchmarks.md#throughput-and-resources))")
    lat = [r for r in data.get("latency", []) if r["contender"] == "walrelay" and r["rate"] == 1000]

    def ms(rs, key):
        # The broker's log-append time has millisecond resolution.
        v = med(rs, key)[0]
        return "under 1 ms" if v is not None and v < 1 else f"{v:.1f} ms"

    def listed(rs, key):
        vals = [f"{r[key]:.2f}" for r in rs if r.get(key) is not None]
        return ", ".join(vals[:-1]) + " and " + vals[-1] if len(vals) > 1 else "".join(vals)
    if lat:
        dl = [r for r in data.get("latency", []) if r["contender"] == "debezium" and r["rate"] == 1000]
        s = (f"insert to broker log append at 1,000 one-row transactions/s with the defaults, the latency section "
             f"(30 s after a 10 s warm-up and a wait for a quiet machine, median of {len(lat)} runs: "
             f"{listed(lat, 'append_p99_ms')} ms): p50 {ms(lat, 'append_p50_ms')}, p99 {ms(lat, 'append_p99_ms')}")
        if dl:
            s += f" (Debezium: {ms(dl, 'append_p50_ms')} and {ms(dl, 'append_p99_ms')})"
        alo = [r for r in data.get("librdkafka", []) if r["kind"] == "alo_1000" and r["variant"] == "librdkafka 2.8.0"]
        side = [r for r in data.get("sidecar", []) if r["contender"] == "walrelay" and r["rate"] == 1000]
        others = []
        if alo:
            others.append(f"{med(alo, 'append_p99_ms')[0]:.2f} ms in the librdkafka section (after 20 s idle, median "
                          f"of {len(alo)} rounds: {listed(alo, 'append_p99_ms')} ms)")
        if side:
            others.append(f"{med(side, 'append_p99_ms')[0]:.2f} ms in the sidecar section (one run, a "
                          f"`pg_recvlogical` reading the same WAL beside it)")
        if others:
            every = [r["append_p99_ms"] for r in lat + alo + side if r.get("append_p99_ms") is not None]
            s += (f"; the same file's other runs of walrelay at that rate give p99 " + " and ".join(others) +
                  f": the same settings, different neighbours on two shared cores, so p99 at 1,000/s is "
                  f"{min(every):.1f} to {max(every):.1f} ms on this machine")
        lines.append(s + " ([latency](docs/benchmarks.md#latency))")
    rg = by(data.get("librdkafka", []), "kind", "variant")
    eos = rg.get(("eos_1000", "librdkafka 2.8.0"), [])
    if eos:
        opts = eos[0].get("options", "")
        boundary = re.search(r"transaction\.boundary\.interval\.ms=(\d+)", opts)
        lines.append(f"exactly once at 1,000 one-row transactions/s with a "
                     f"{boundary.group(1) if boundary else '?'} ms `transaction.boundary.interval.ms` (the default is "
                     f"100 ms), librdkafka 2.8.0, median of {len(eos)} rounds: p99 {med(eos, 'consumer_p99_ms')[0]:.0f} "
                     f"ms from insert to visible for a `read_committed` consumer ([librdkafka 2.8.0 and 2.0.2]"
                     f"(docs/benchmarks.md#the-goals-of-exactly-once-and-idle-on-librdkafka-280-and-202))")
    if not lines:
        return "_No figures: the latest run holds no throughput or latency section._"
    return (f"On 2 cores beside PostgreSQL and Kafka, all from {src} (`bench/run.sh`'s full run, "
            f"{data.get('started', '?')} to {data.get('finished', '?')}, walrelay built Release by it): " +
            "; ".join(lines) + ".")


def files(folder_path):
    """Every results file of the folder: what it holds, when it ran, what ran and with which walrelay."""
    import glob
    folder = os.path.basename(os.path.normpath(os.path.realpath(folder_path)))
    out = ["| file | ran | what | walrelay |", "|---|---|---|---|"]
    for f in sorted(glob.glob(os.path.join(folder_path, "*.json"))):
        name, d = os.path.basename(f), json.load(open(f))
        if name == "decoder.json":
            ctx = d.get("context", {})
            out.append(f"| `{name}` | {ctx.get('date', '?')} | the decoder's micro-benchmark, `bench/run.sh`'s full run "
                       f"| `{ctx.get('executable', '?')}` |")
        elif isinstance(d, list):
            out.append(f"| `{name}` | not recorded | `bench/idle_threads.py` | "
                       + ", ".join(f"`{r['binary']}`" for r in d if r.get("binary")) + " |")
        elif "runs" in d and "machine" in d and "argv" in d and "versions" in d:
            out.append(f"| `{name}` | {d.get('started', '?')} to {d.get('finished', '?')} | {command(d)} | "
                       + "; ".join(binaries(d)) + " |")
        else:
            out.append(f"| `{name}` | {d.get('started', 'not recorded')} to {d.get('finished', '?')} | "
                       f"`bench/idle_threads.py` | " + "; ".join(f"`{b.get('path', '?')}`" for b in
                                                            d.get("builds", {}).values()) + " |")
    return (f"In `bench/results/{folder}/` (the CSV files beside them hold the same rows):\n\n" + "\n".join(out))


def sections(data, folder_path):
    folder = os.path.basename(os.path.normpath(os.path.realpath(folder_path)))
    def full(body, what=""):
        return full_line(data, folder, what) + "\n\n" + body
    return {
        "files": files(folder_path),
        "run": header(data, folder),
        "librdkafka": full(librdkafka_goals(data), ", its `librdkafka` section"),
        "decoder": decoder(folder_path),
        "throughput": full(throughput(data) if data.get("runs") else "_This run has no throughput section._",
                           ", its `runs`"),
        "targets": full(targets(data) if data.get("runs") else "–", ", its `runs`"),
        "pg-load": full(pg_load(data) if data.get("runs") else "–", ", its `runs`"),
        "options": full(options(data) if data.get("option_runs") else "_This run has no options section._",
                        ", its `option_runs`"),
        "latency": full(latency(data) if data.get("latency") else "_This run has no latency section._",
                        ", its `latency` section"),
        "sidecar": full(sidecar(data), ", its `sidecar` section"),
        "tableless": full(tableless(data), ", its `tableless` section"),
        "headline": readme_headline(data, folder),
        "eos-throughput": eos_throughput(folder_path),
        "idle-threads": idle_threads(folder_path),
        "formats": formats(data, folder_path),
        "sinks": sinks(data, folder_path),
        "snapshot": snapshot(data, folder_path),
    }


def update(path, parts):
    """Replaces what lies between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->`."""
    text = open(path).read()
    for name, body in parts.items():
        pat = re.compile(rf"(<!-- bench:{re.escape(name)} -->).*?(<!-- /bench:{re.escape(name)} -->)", re.S)
        text = pat.sub(lambda mt: mt.group(1) + "\n" + body + "\n" + mt.group(2), text)
    with open(path, "w") as f:
        f.write(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folder", help="a run's results folder (bench/results/<date> or bench/results/latest)")
    ap.add_argument("--update", action="append", default=[], metavar="FILE",
                    help="rewrite the generated parts of FILE (docs/benchmarks.md, README.md)")
    args = ap.parse_args()
    data = json.load(open(os.path.join(args.folder, "full.json")))
    parts = sections(data, args.folder)
    if not args.update:
        for name, body in parts.items():
            print(f"## {name}\n\n{body}\n")
    for path in args.update:
        update(path, parts)


if __name__ == "__main__":
    main()
