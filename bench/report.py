#!/usr/bin/env python3
"""Markdown tables of a bench run, for docs/benchmarks.md:
bench/report.py bench/results/full.json > /tmp/tables.md"""
import json
import statistics
import sys

ORDER = ["pg_recvlogical", "walrelay", "debezium", "polling"]


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
                   f"{med(rs, 'append_p50_ms')[1]} | {med(rs, 'append_p99_ms')[1]} | "
                   f"{med(rs, 'append_p99.9_ms')[1]} | {med(rs, 'append_max_ms')[1]} | {self_p99} | "
                   f"{med(rs, 'consumer_p50_ms')[1]} | {med(rs, 'consumer_p99_ms')[1]} |")
    return "\n".join(out)


def main():
    data = json.load(open(sys.argv[1]))
    print("## Throughput and resources\n" + throughput(data))
    print("\n## Targets\n\n" + targets(data))
    print("\n## Load on PostgreSQL\n\n" + pg_load(data))
    print("\n## pgoutput options\n\n" + options(data))
    print("\n## Latency (ms)\n\n" + latency(data))


if __name__ == "__main__":
    main()
