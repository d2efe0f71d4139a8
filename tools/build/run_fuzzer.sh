#!/usr/bin/env bash
# Runs a libFuzzer binary for a bounded time over a corpus seeded with the given files.
#   run_fuzzer.sh FUZZER SECONDS [SEED_FILE...]
set -euo pipefail
fuzzer="$1"; seconds="$2"; shift 2
corpus="${TEST_TMPDIR:-$(mktemp -d)}/corpus"
mkdir -p "$corpus"
for seed in "$@"; do cp "$seed" "$corpus/"; done
# -rss_limit_mb bounds memory: a parser that allocates what a hostile header asks for fails here.
exec "$fuzzer" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
  "$corpus"
