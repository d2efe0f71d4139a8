#!/usr/bin/env python3
"""Sums up tools/bench/returning_users.sh: a Markdown report on stdout and
returning_users.png in the same directory.

    python3 tools/bench/returning_users_report.py OUT_DIR

Percentiles are nearest-rank over the requests each run's JSON lists (the
same rule as `kvd bench serve`). The plot needs matplotlib; without it only
the tables are printed.
"""
import json
import math
import os
import sys


CAPACITY_NAMES = {"kvd": "kvd, one node", "router": "kvd, router to 3 nodes",
                  "llama": "llama-server"}


def pct(values, p):
    if not values:
        return None
    v = sorted(values)
    rank = max(1, int(math.ceil(p / 100.0 * len(v))))
    return v[min(len(v), rank) - 1]


def ms(x):
    return "-" if x is None else "%.0f" % (x * 1e3)


def load(out, name):
    path = os.path.join(out, name + ".json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def where(r, event):
    """The row of a continued turn, as `kvd bench serve` names it."""
    state = r.get("state") or "continued"
    if not r.get("first_after_event"):
        return state
    return "first after %s%s: %s" % (
        event, ", on another node" if r.get("moved") else "", state)


def rows_of(run, label, event):
    """(row label, TTFTs) of a run's continued turns, grouped by where the
    session was found."""
    groups = {}
    for r in run["requests"]:
        if r["ok"] and r["resumed"] and r["ttft_s"] >= 0:
            groups.setdefault(where(r, event), []).append(r["ttft_s"])
    return [("%s: %s" % (label, k), v) for k, v in sorted(groups.items())]


def main():
    out = sys.argv[1]
    with open(os.path.join(out, "machine.txt")) as f:
        print("```\n" + f.read().strip() + "\n```\n")

    # 1. The returning user's TTFT by where the conversation was found.
    table = []
    for name, label, event in [
            ("kvd", "kvd", "restart"),
            ("migration", "kvd x3", "migration"),
            ("failover", "kvd x3 R=2", "failover"),
            ("reprefill", "kvd stateless (re-prefill every turn)", "-"),
            ("llama-server", "llama-server", "restart")]:
        run = load(out, name)
        if run is None:
            continue
        for row, v in rows_of(run, label, event):
            table.append((row, v))
    print("| returning user's turn: server, where the conversation was "
          "found | turns | TTFT p50 ms | p95 ms | p99 ms |")
    print("|---|---:|---:|---:|---:|")
    for row, v in table:
        print("| %s | %d | %s | %s | %s |" % (
            row, len(v), ms(pct(v, 50)), ms(pct(v, 95)), ms(pct(v, 99))))

    # 2. The same runs as wholes.
    print("\n| run | ok | failed | output tok/s | TTFT p50 ms | p95 ms | "
          "event: users held s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in ("kvd", "reprefill", "llama-server", "migration", "failover"):
        run = load(out, name)
        if run is None:
            continue
        s = run["summary"]["all"]
        ttft = [r["ttft_s"] for r in run["requests"]
                if r["ok"] and r["ttft_s"] >= 0]
        event = run["summary"].get("event")
        print("| %s | %d | %d | %.1f | %s | %s | %s |" % (
            name, s["ok"], s["failures"], s["output_tokens_per_s"],
            ms(pct(ttft, 50)), ms(pct(ttft, 95)),
            "%.1f" % event["held_s"] if event and event["ran"] else "-"))

    # 3. Capacity: the most users with p95 TTFT under 2 s.
    capacity = {}
    for f in sorted(os.listdir(out)):
        if not (f.startswith("cap-") and f.endswith(".json")):
            continue
        system, users = f[len("cap-"):-len(".json")].rsplit("-", 1)
        run = load(out, f[:-len(".json")])
        ttft = [r["ttft_s"] for r in run["requests"]
                if r["ok"] and r["ttft_s"] >= 0]
        s = run["summary"]["all"]
        capacity.setdefault(system, []).append(
            (int(users), pct(ttft, 95), s["failures"],
             s["output_tokens_per_s"]))
    if capacity:
        names = CAPACITY_NAMES
        print("\n| server | users | TTFT p95 ms | failed | output tok/s |")
        print("|---|---:|---:|---:|---:|")
        for system in sorted(capacity):
            for users, p95, failed, tps in sorted(capacity[system]):
                print("| %s | %d | %s | %d | %.1f |" % (
                    names.get(system, system), users, ms(p95), failed, tps))
        print()
        for system in sorted(capacity):
            fit = [u for u, p95, failed, _ in capacity[system]
                   if p95 is not None and p95 < 2.0 and failed == 0]
            print("- %s: at most %s users keep p95 TTFT under 2 s" % (
                names.get(system, system),
                max(fit) if fit else "none of the"))
    plot(out, table, capacity)


def plot(out, table, capacity):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("\n(no matplotlib: no plot)")
        return
    from matplotlib.ticker import NullFormatter, ScalarFormatter
    fig, axes = plt.subplots(1, 2 if capacity else 1, figsize=(17, 7),
                             squeeze=False,
                             gridspec_kw={"width_ratios": [3, 2]}
                             if capacity else None)
    ax = axes[0][0]
    labels = [row for row, _ in table]
    p50 = [pct(v, 50) * 1e3 for _, v in table]
    p99 = [pct(v, 99) * 1e3 for _, v in table]
    y = range(len(labels))
    ax.barh([i + 0.2 for i in y], p99, height=0.4, label="p99",
            color="#c0c0c0")
    ax.barh([i - 0.2 for i in y], p50, height=0.4, label="p50",
            color="#3070b0")
    ax.set_yticks(list(y))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("time to first token, ms (log)")
    ax.set_title("Returning user's TTFT by where the conversation was found")
    ax.legend()
    if capacity:
        ax = axes[0][1]
        for system, points in sorted(capacity.items()):
            points.sort()
            ax.plot([p[0] for p in points],
                    [(p[1] or 0) * 1e3 for p in points], marker="o",
                    label=CAPACITY_NAMES.get(system, system))
        ax.axhline(2000, color="red", linestyle="--", linewidth=1)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.set_xlabel("concurrent users")
        ax.set_ylabel("TTFT p95, ms (log)")
        ax.set_title("Users vs p95 TTFT (2 s line)")
        ax.legend()
    fig.tight_layout()
    path = os.path.join(out, "returning_users.png")
    fig.savefig(path, dpi=110)
    print("\nplot: %s" % path)


if __name__ == "__main__":
    main()
