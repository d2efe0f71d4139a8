#!/usr/bin/env bash
# Runs the fault harness (tests/cluster/nemesis.py) for any length: a 3-member
# etcd, three nodes and a router on hosts of their own (network namespaces),
# users conversing while a seeded schedule of faults runs, then the checker's
# summary. Needs root (namespaces, iptables, tmpfs); builds kvd first.
#
#   tools/cluster/nemesis.sh                         # 2 minutes, seed 1, every fault kind
#   tools/cluster/nemesis.sh --seconds 1800 --seed 7
#   tools/cluster/nemesis.sh --kinds pause,kill --seed 3 --seed 4
#
# History (every request and fault) and process logs go to --out
# (default: ./nemesis-out).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ "$(id -u)" != 0 ]]; then
  echo "nemesis.sh: run as root: hosts are network namespaces" >&2
  exit 1
fi
# Bazel takes $TEST_TMPDIR as its output root when set: keep it out.
env -u TEST_TMPDIR bazel build -c opt //tools/kvd >&2
built=$(env -u TEST_TMPDIR bazel info -c opt bazel-bin 2>/dev/null)/tools/kvd/kvd
scratch=${TEST_TMPDIR:-$(mktemp -d)}
# A copy: a build meanwhile must not replace the binary nodes restart from.
cp "$built" "$scratch/kvd"
args=("$@")
[[ " ${args[*]} " == *" --out "* ]] || args+=(--out nemesis-out)
TEST_TMPDIR=$scratch exec python3 tests/cluster/nemesis.py "$scratch/kvd" \
  tools/cluster/make_certs.sh "${args[@]}"
