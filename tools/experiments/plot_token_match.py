#!/usr/bin/env python3
"""Plots the token-match experiment: match % and mean KL per policy vs budget, one column per model.

Reads the CSV written by //tools/experiments:token_match (one row per model, prompt, policy and
budget), pools each (model, policy, budget) over its prompts' steps as the Markdown table does,
and writes a PNG. For a free-running CSV (mode column "free", --free_running) the second row
shows the mean identical prefix (tokens before the first divergence) instead of the KL.

    pip install matplotlib
    python3 tools/experiments/plot_token_match.py /tmp/token_match.csv docs/img/token_match.png
"""
import collections
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

POLICY_ORDER = ["kv-direct", "window", "streaming-llm", "h2o", "tova", "snapkv"]
MARKERS = {"kv-direct": "o", "window": "s", "streaming-llm": "^", "h2o": "v", "tova": "D",
           "snapkv": "P"}


def main(csv_path, png_path):
    # (model, policy, budget) -> [steps, matches, kl_sum, kl_steps, runs, prefix_sum]
    pooled = collections.defaultdict(lambda: [0, 0, 0.0, 0, 0, 0])
    free = False
    with open(csv_path) as f:
        for row in csv.DictReader(f):
            key = (row["model"], row["policy"], int(row["budget"]))
            steps = int(row["steps"])
            # CSVs from before the free-running mode have no mode / kl_steps columns.
            free = free or row.get("mode") == "free"
            kl_steps = int(row.get("kl_steps") or steps)
            pooled[key][0] += steps
            pooled[key][1] += int(row["matches"])
            pooled[key][2] += float(row["mean_kl"]) * kl_steps
            pooled[key][3] += kl_steps
            pooled[key][4] += 1
            pooled[key][5] += int(row.get("identical_prefix") or 0)
    max_steps = max(v[0] / v[4] for v in pooled.values())
    models = sorted({k[0] for k in pooled})
    fig, axes = plt.subplots(2, len(models), figsize=(6 * len(models), 8), squeeze=False)
    for col, model in enumerate(models):
        policies = [p for p in POLICY_ORDER if any(k[:2] == (model, p) for k in pooled)]
        for policy in policies:
            budgets = sorted(k[2] for k in pooled if k[:2] == (model, policy))
            cells = [pooled[(model, policy, b)] for b in budgets]
            match = [100.0 * c[1] / c[0] for c in cells]
            style = dict(marker=MARKERS.get(policy, "x"), label=policy,
                         linewidth=2.5 if policy == "kv-direct" else 1.2)
            axes[0][col].plot(budgets, match, **style)
            if free:
                axes[1][col].plot(budgets, [c[5] / c[4] for c in cells], **style)
            else:
                kl = [c[2] / c[3] for c in cells]
                # KL is exactly 0 for kv-direct: draw it on the axis floor.
                axes[1][col].plot(budgets, [max(v, 1e-6) for v in kl], **style)
        axes[0][col].set_title(model + (" (free-running)" if free else ""))
        axes[0][col].set_ylabel("greedy token match vs full cache (%)")
        axes[0][col].set_ylim(0, 102)
        if free:
            axes[1][col].set_ylabel("mean identical prefix (tokens before divergence)")
            axes[1][col].set_ylim(0, max_steps * 1.03)
        else:
            axes[1][col].set_ylabel("mean KL(full || policy), nats (0 drawn at 1e-6)")
            axes[1][col].set_yscale("log")
            axes[1][col].set_ylim(5e-7, 20)
        for ax in (axes[0][col], axes[1][col]):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("K/V budget B (positions)")
            ax.grid(True, which="both", alpha=0.3)
        axes[0][col].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    print("wrote", png_path)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
