#!/usr/bin/env python3
"""Plots of a bench run, of whatever sections it holds: bench/plot.py bench/results/latest/full.json docs/img"""
import json
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ORDER = ["pg_recvlogical", "walrelay", "debezium", "polling"]
COLORS = {"pg_recvlogical": "#888888", "walrelay": "#1f77b4", "debezium": "#d62728", "polling": "#2ca02c"}


def groups(runs, key):
    """{workload: {contender: [values]}} for one metric."""
    g = {}
    for r in runs:
        if r.get(key) is None:
            continue
        g.setdefault(r["workload"], {}).setdefault(r["contender"], []).append(r[key])
    return g


def bars(ax, g, ylabel, log=False):
    workloads = list(g)
    width = 0.8 / len(ORDER)
    for i, c in enumerate(ORDER):
        xs, ys, lo, hi = [], [], [], []
        for j, w in enumerate(workloads):
            vals = g[w].get(c)
            if not vals:
                continue
            m = statistics.median(vals)
            xs.append(j + (i - (len(ORDER) - 1) / 2) * width)
            ys.append(m)
            lo.append(m - min(vals))
            hi.append(max(vals) - m)
        if xs:
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=c, color=COLORS[c])
            for x, y in zip(xs, ys):
                ax.annotate(f"{y:,.0f}" if y >= 10 else f"{y:.2g}", (x, y), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(workloads)))
    ax.set_xticklabels(workloads)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.legend(fontsize=8)


def main():
    data = json.load(open(sys.argv[1]))
    out = sys.argv[2]
    os.makedirs(out, exist_ok=True)
    if data.get("runs"):
        throughput_and_resources(data, out)
    if data.get("latency"):
        latency(data["latency"], out)
    if data.get("sidecar"):
        sidecar(data["sidecar"], out)
    if data.get("retention_series"):
        retention(data["retention_series"], out)
    if data.get("librdkafka"):
        eos_librdkafka([r for r in data["librdkafka"] if r["kind"] in ("floor", "eos_1000")], out)


def throughput_and_resources(data, out):
    runs = data["runs"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    bars(ax, groups(runs, "total_events_per_s"), "events/s, launch to last ack (pg_recvlogical: to end LSN)")
    ax.set_title("Throughput, median of repeats, bars = min..max")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "bench-throughput.png"), dpi=110)

    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    bars(axes[0], groups(runs, "cpu_us_per_event"), "relay CPU µs per event", log=True)
    bars(axes[1], groups(runs, "peak_rss_mib"), "peak RSS MiB (VmHWM)", log=True)
    bars(axes[2], groups(runs, "startup_s"), "start-up to first event in Kafka, s", log=True)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "bench-resources.png"), dpi=110)

    if data.get("option_runs"):
        g = {}
        for r in data["option_runs"]:
            label = f'{r["contender"]}\n{r["options"].replace("proto_version=", "v").replace("pgoutput.", "")}'
            if r.get("pg_backend_cpu_us_per_event") is not None:
                g.setdefault(label, []).append(r["pg_backend_cpu_us_per_event"])
        base = groups([r for r in runs if r["contender"] in ("pg_recvlogical", "walrelay")],
                      "pg_backend_cpu_us_per_event")
        first = data["option_runs"][0]["workload"]
        for c, vals in base.get(first, {}).items():
            opt = "v1" if c == "pg_recvlogical" else "v3 (default)"
            g.setdefault(f"{c}\n{opt}", []).extend(vals)
        labels = sorted(g)
        fig, ax = plt.subplots(figsize=(9, 4.2))
        meds = [statistics.median(g[k]) for k in labels]
        ax.bar(range(len(labels)), meds, yerr=[[m - min(g[k]) for m, k in zip(meds, labels)],
                                               [max(g[k]) - m for m, k in zip(meds, labels)]], capsize=3)
        for i, m in enumerate(meds):
            ax.annotate(f"{m:.1f}", (i, m), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_ylabel("walsender CPU µs per event")
        ax.set_title(f"walsender CPU per row by pgoutput options ({first})")
        fig.tight_layout()
        fig.savefig(os.path.join(out, "bench-walsender-options.png"), dpi=110)



def latency(runs, out):
    # One bar group per contender and rate: the median over the repeats.
    by_rate = {}
    for r in runs:
        by_rate.setdefault((r["contender"], r.get("options", ""), r["rate"]), []).append(r)
    lat = [{"contender": c, "options": o, "rate": rate, "n": len(rs),
            **{f"append_p{p}_ms": statistics.median([r.get(f"append_p{p}_ms") or 0 for r in rs])
               for p in ("50", "99", "99.9")}} for (c, o, rate), rs in by_rate.items()]
    fig, ax = plt.subplots(figsize=(10, 4.4))
    labels = [f'{r["contender"]}' + (f'\n{r["options"].split(",")[0].replace("kafka.", "")}' if r["options"] else "")
              + f'\n{r["rate"]:,}/s' + (f' (n={r["n"]})' if r["n"] > 1 else "") for r in lat]
    for k, (p, col) in enumerate((("50", "#9ecae1"), ("99", "#3182bd"), ("99.9", "#08519c"))):
        vals = [r.get(f"append_p{p}_ms") or 0 for r in lat]
        xs = [i + (k - 1) * 0.27 for i in range(len(lat))]
        ax.bar(xs, vals, 0.27, label=f"p{p}", color=col)
        for x, v in zip(xs, vals):
            ax.annotate(f"{v:.0f}" if v >= 10 else f"{v:.1f}", (x, v), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(lat)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("insert-to-log-append ms")
    ax.axhline(10, color="red", linewidth=0.8, linestyle="--")
    ax.set_title("Latency at fixed offered rates (1-row transactions)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "bench-latency.png"), dpi=110)


SIDECAR_ORDER = ["walrelay", "debezium", "polling"]


def sidecar(runs, out):
    """CPU per event and latency against the rate, medians over repeats."""
    def series(contender, key):
        by_rate = {}
        for r in runs:
            if r["contender"] == contender and r.get(key) is not None:
                by_rate.setdefault(r["rate"], []).append(r[key])
        rates = sorted(by_rate)
        return rates, [statistics.median(by_rate[x]) for x in rates]

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
    ax = axes[0]
    for c in SIDECAR_ORDER:
        xs, ys = series(c, "relay_cpu_us_per_event")
        if xs:
            ax.plot(xs, ys, "o-", color=COLORS[c], label=c)
            for x, y in zip(xs, ys):
                ax.annotate(f"{y:.0f}", (x, y), textcoords="offset points", xytext=(0, 5), ha="center", fontsize=7)
        xs, ys = series(c, "relay_server_cpu_us_per_event")
        if xs:
            ax.plot(xs, ys, "x:", color=COLORS[c], label=f"{c}'s {'backends' if c == 'polling' else 'walsender'}")
    # pg_recvlogical beside walrelay (the same WAL, the same seconds)
    ref = [r for r in runs if r["contender"] == "walrelay"]
    xs, ys = series("walrelay", "recvlogical_cpu_us_per_event") if ref else ([], [])
    if xs:
        ax.plot(xs, ys, "o--", color=COLORS["pg_recvlogical"], label="pg_recvlogical (beside walrelay)")
        for x, y in zip(xs, ys):
            ax.annotate(f"{y:.0f}", (x, y), textcoords="offset points", xytext=(0, -11), ha="center", fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("one-row transactions per second")
    ax.set_ylabel("CPU µs per event")
    ax.set_title("Sidecar cost: CPU per event (lines: client, dotted: its server process)")
    ax.legend(fontsize=7)
    ax = axes[1]
    for c in SIDECAR_ORDER:
        for p, style in (("50", "o-"), ("99", "s--")):
            xs, ys = series(c, f"append_p{p}_ms")
            if xs:
                # LogAppendTime has 1 ms resolution: what is under it is drawn at 0.5 ms
                ax.plot(xs, [max(y, 0.5) for y in ys], style, color=COLORS[c], label=f"{c} p{p}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.axhline(1, color="grey", linewidth=0.6, linestyle=":")
    ax.axhline(5, color="red", linewidth=0.8, linestyle="--")
    ax.set_xlabel("one-row transactions per second")
    ax.set_ylabel("insert to log append, ms")
    ax.set_title("Latency at the same rates (red: 5 ms; 0.5 = under the 1 ms resolution)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "bench-sidecar.png"), dpi=110)


def eos_librdkafka(runs, out):
    """Exactly once at one rate: insert -> visible percentiles and CPU per
    variant (librdkafka versions, the transactional producer alone), one
    point per interleaved round."""
    variants = list(dict.fromkeys(r["variant"] for r in runs))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6), gridspec_kw={"width_ratios": [2, 1]})
    ax = axes[0]
    for p, marker in (("50", "o"), ("99", "s"), ("99.9", "^")):
        for i, v in enumerate(variants):
            ys = [r[f"consumer_p{p}_ms"] for r in runs if r["variant"] == v]
            ax.plot([i + {"50": -0.2, "99": 0, "99.9": 0.2}[p]] * len(ys), ys, marker, color=f"C{i}",
                    label=f"p{p}" if i == 0 else None, markerfacecolor="none" if p != "99" else f"C{i}")
    ax.axhline(25, color="red", linewidth=0.8, linestyle="--", label="p99 goal (25 ms)")
    ax.set_xticks(range(len(variants)))
    ax.set_xticklabels([v.replace(", ", ",\n", 1) for v in variants], fontsize=8)
    ax.set_ylabel("insert -> visible (read_committed), ms")
    ax.set_title("Exactly once, 1,000 one-row tx/s, 10 ms boundary: p50 (left), p99 (middle), p99.9 (right) per round")
    ax.legend(fontsize=7)
    ax = axes[1]
    for i, v in enumerate(variants):
        ys = [r["relay_cpu_us_per_event"] for r in runs if r["variant"] == v and r.get("relay_cpu_us_per_event")]
        if ys:
            ax.plot([i] * len(ys), ys, "o", color=f"C{i}")
    ax.set_xticks(range(len(variants)))
    ax.set_xticklabels([v.replace(", ", ",\n", 1) for v in variants], fontsize=8)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("walrelay CPU µs per event")
    ax.set_title("walrelay's CPU per event")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "bench-eos-librdkafka.png"), dpi=110)

def retention(series, out):
    """The outbox's size and rows over time under a steady load: walrelay's
    retention (delete) beside the polling relay (bench/retention.py)."""
    fig, (size_ax, rows_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for contender in sorted({s["contender"] for s in series}):
        for rep in sorted({s.get("repeat", 1) for s in series}):
            pts = [s for s in series if s["contender"] == contender and s.get("repeat", 1) == rep]
            label = contender if rep == 1 else None
            style = "-" if contender == "walrelay" else "--"
            size_ax.plot([p["t_s"] for p in pts], [p["table_bytes"] / 1e6 for p in pts], style, label=label)
            rows_ax.plot([p["t_s"] for p in pts], [p["rows"] for p in pts], style, label=label)
    size_ax.set_xlabel("seconds of writes at 1,000 events/s")
    size_ax.set_ylabel("outbox size on disk (MB)")
    rows_ax.set_xlabel("seconds of writes at 1,000 events/s")
    rows_ax.set_ylabel("rows in the outbox")
    size_ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "bench-retention.png"), dpi=110)


if __name__ == "__main__":
    main()
