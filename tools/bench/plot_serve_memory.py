#!/usr/bin/env python3
"""Plots server RSS over time from `kvd bench serve --json` outputs.

Each JSON holds `server_rss_mib.series_s_mib` ([seconds, MiB] samples taken
once a second by --server-pid). One line per file, with an optional dashed
line for a memory bound the run was configured with.

    python3 tools/bench/plot_serve_memory.py docs/img/serve_memory.png \
        "kvd, DRAM tier 1024 MiB=/tmp/run1/kvd.json" \
        "kvd, DRAM tier 256 MiB=/tmp/run2/kvd.json@1240" ...

Each argument is LABEL=PATH[@BOUND_MIB]. Needs matplotlib
(pip install matplotlib).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    out = argv[1]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for spec in argv[2:]:
        label, _, path = spec.partition("=")
        path, _, bound = path.partition("@")
        with open(path) as f:
            series = json.load(f)["server_rss_mib"]["series_s_mib"]
        line, = ax.plot([s for s, _ in series], [m for _, m in series],
                        label=label)
        if bound:
            ax.axhline(float(bound), color=line.get_color(), linestyle="--",
                       linewidth=0.8, label=f"{label}: configured bound")
    ax.set_xlabel("seconds since the load started")
    ax.set_ylabel("server RSS (MiB)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
