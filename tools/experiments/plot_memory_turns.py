#!/usr/bin/env python3
"""Plots the 20-turn memory experiment and prints its Markdown table.

Reads the CSVs written by //tools/experiments:memory_turns (one per policy, one row per turn) and
writes a PNG: cache bytes per turn (K/V allocated, residual store, their sum) for every policy,
and each process's VmRSS / VmHWM (which include the model weights) in a second panel.

    pip install matplotlib
    python3 tools/experiments/plot_memory_turns.py docs/img/memory_turns_kv.csv \
        docs/img/memory_turns_kv-direct.csv docs/img/memory_turns.png > /tmp/memory_turns.md
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MIB = 1024.0 * 1024.0


def label(row):
    return row["policy"] if int(row["budget"]) < 0 else f"{row['policy']} B={row['budget']}"


def read(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def table(runs):
    """MiB per turn; a run without residuals shows K/V allocated and used (rows held)."""
    names = [label(rows[0]) for rows in runs]
    direct = [any(int(r["residual_bytes"]) for r in rows) for rows in runs]
    head = "| turn | tokens |"
    for n, d in zip(names, direct):
        head += (f" {n}: hot K/V | {n}: residuals | {n}: sum | {n}: VmHWM |" if d else
                 f" {n}: K/V alloc | {n}: K/V used | {n}: VmHWM |")
    lines = [head, "|" + "---|" * (2 + sum(4 if d else 3 for d in direct))]
    for i in range(len(runs[0])):
        r0 = runs[0][i]
        line = f"| {r0['turn']} | {r0['tokens']} |"
        for rows, d in zip(runs, direct):
            r = rows[i]
            assert r["tokens"] == r0["tokens"], "runs saw different token counts"
            mib = lambda k: int(r[k]) / MIB  # noqa: E731
            if d:
                line += (f" {mib('kv_bytes'):.2f} | {mib('residual_bytes'):.2f} |"
                         f" {mib('total_bytes'):.2f} | {mib('vm_hwm'):.1f} |")
            else:
                line += f" {mib('kv_bytes'):.2f} | {mib('kv_used_bytes'):.2f} | {mib('vm_hwm'):.1f} |"
        lines.append(line)
    return "\n".join(lines)


def main(paths, png_path):
    runs = [read(p) for p in paths]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    colors = ["tab:blue", "tab:red", "tab:green", "tab:purple"]
    for color, rows in zip(colors, runs):
        name = label(rows[0])
        turns = [int(r["turn"]) for r in rows]
        kv = [int(r["kv_bytes"]) / MIB for r in rows]
        res = [int(r["residual_bytes"]) / MIB for r in rows]
        total = [int(r["total_bytes"]) / MIB for r in rows]
        if any(res):
            ax.plot(turns, kv, color=color, linestyle="--", marker=".",
                    label=f"{name}: hot K/V (allocated)")
            ax.plot(turns, res, color=color, linestyle=":", marker=".",
                    label=f"{name}: residual store")
            ax.plot(turns, total, color=color, linewidth=2.5, marker="o",
                    label=f"{name}: K/V + residuals")
        else:
            ax.plot(turns, kv, color=color, linewidth=2.5, marker="o",
                    label=f"{name}: K/V (allocated)")
            ax.plot(turns, [int(r["kv_used_bytes"]) / MIB for r in rows], color=color,
                    linestyle=":", marker=".", label=f"{name}: K/V (rows held)")
        ax2.plot(turns, [int(r["vm_rss"]) / MIB for r in rows], color=color, marker=".",
                 label=f"{name}: VmRSS")
        ax2.plot(turns, [int(r["vm_hwm"]) / MIB for r in rows], color=color, linestyle="--",
                 label=f"{name}: VmHWM (peak)")
    tokens = [int(r["tokens"]) for r in runs[0]]
    ax.set_title(f"Session cache bytes per turn ({tokens[-1]} tokens after "
                 f"{len(tokens)} turns)")
    ax.set_xlabel("turn")
    ax.set_ylabel("MiB")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax2.set_title("Process memory (includes model weights), one process per policy")
    ax2.set_xlabel("turn")
    ax2.set_ylabel("MiB")
    ax2.grid(True, alpha=0.3)
    for a in (ax, ax2):
        a.set_xticks(range(1, len(tokens) + 1))
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    print(table(runs))
    print(f"\nwrote {png_path}", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1:-1], sys.argv[-1])
