#!/usr/bin/env python3
"""The fault harness in CI (issue 31): a 3-member etcd, three nodes and a
router on hosts of their own (network namespaces), users conversing while
tests/cluster/nemesis.py runs a fixed seed's 2-minute schedule of faults;
then its checker: no acknowledged turn lost, none duplicated, every stored
history and acknowledged reply identical to a single-node replay, and the
checker shown to catch a hidden turn and an altered reply on this run's
data.

Fault kinds that today's cluster is known to fail are left out here and
named in KNOWN_UNSAFE with the finding (docs/CLUSTER.md, "What the fault
harness found"); tools/cluster/nemesis.sh runs them.

  bazel test //tests/cluster:nemesis_test
  KVD_NEMESIS_SEEDS=3,4 KVD_NEMESIS_SECONDS=300 bazel test ...
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nemesis  # noqa: E402
from netns import check_available  # noqa: E402

# Kinds under which today's cluster loses or strands acknowledged turns,
# with the finding (docs/CLUSTER.md, "What the fault harness found"); the
# partitioned-ownership redesign must empty this.
KNOWN_UNSAFE = {
    "wipe": "a failover leaves a session one copy until its new owner's "
            "refill pass (up to 10 s); a disk lost on that node within the "
            "window loses the session (seed 11, 10 minutes: 2 of 65 "
            "sessions). Keeping the old owner's copy as an in-sync replica "
            "(issue 32) closes it; runs with wipes but without that timing "
            "lost nothing (seeds 1 and 7)",
}


def main():
    reason = check_available()
    if reason:
        print("FAIL: the fault harness cannot run here: " + reason)
        sys.exit(1)
    seeds = [int(s) for s in os.environ.get("KVD_NEMESIS_SEEDS",
                                            "1").split(",")]
    seconds = float(os.environ.get("KVD_NEMESIS_SECONDS", "120"))
    kinds = [k for k in nemesis.KINDS if k not in KNOWN_UNSAFE]
    print("fault kinds: %s\nleft out (known unsafe today): %s" % (
        kinds, KNOWN_UNSAFE), flush=True)
    bad = []
    for seed in seeds:
        found = nemesis.run(os.path.abspath(sys.argv[1]),
                            os.path.abspath(sys.argv[2]), seed, seconds,
                            users=6, kinds=kinds,
                            out_dir=os.environ.get(
                                "TEST_UNDECLARED_OUTPUTS_DIR"))
        if nemesis.failed(found):
            bad.append(seed)
    if bad:
        print("FAIL: seeds %s broke the checker's invariants (above)" % bad)
        sys.exit(1)
    print("ok: seeds %s, no acknowledged turn lost, duplicated or divergent"
          % seeds)


if __name__ == "__main__":
    main()
