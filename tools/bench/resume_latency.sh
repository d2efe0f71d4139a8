#!/usr/bin/env bash
# Resume latency of durable sessions: time to the first new token of a turn in a freshly
# started process, for sessions of several lengths, per checkpoint policy. The session is
# created in one process (a long first message), and resumed in another: `kvd chat --jsonl`
# reports `restore_seconds` (reading the checkpoint + rebuilding K/V, or re-prefilling for the
# tokens policy) and the new turn's prefill; time to first token = restore + prefill of the
# new message + one decode step.
#
# usage: tools/bench/resume_latency.sh [KVD] [MODEL] [LENGTHS...]
#   defaults: bazel-bin/tools/kvd/kvd smollm2 1024 4096
set -euo pipefail
KVD="${1:-bazel-bin/tools/kvd/kvd}"
MODEL="${2:-smollm2}"
shift 2 2>/dev/null || true
LENGTHS=("${@:-1024 4096}")
[[ ${#LENGTHS[@]} -eq 1 ]] && read -r -a LENGTHS <<< "${LENGTHS[0]}"
DIR="$(mktemp -d)"
trap 'rm -rf "$DIR"' EXIT
COMMON=(--model "$MODEL" --temperature 0 --max-tokens 1 --jsonl --raw)

# A first message of about N tokens (SmolLM2 / Gemma tokenizers: ~1 token per word here).
message() { python3 -c "import sys; print(' '.join(['word%d' % (i % 97) for i in range(int(sys.argv[1]) // 2)]))" "$1"; }

printf "%-8s %-10s %12s %14s %12s\n" tokens policy stored_MiB restore_ms path
for n in "${LENGTHS[@]}"; do
  msg="$(message "$n")"
  for policy in kv-direct stride:4 stride:10 tokens; do
    d="$DIR/$n-${policy/:/}"
    "$KVD" chat "${COMMON[@]}" --policy "$policy" --data-dir "$d" --session s "$msg" > "$d.create"
    sync
    # Drop the page cache if allowed, so the restore reads from disk.
    echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
    "$KVD" chat "${COMMON[@]}" --data-dir "$d" --session s "next" > "$d.resume"
    tokens=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['session_tokens'])" "$d.create")
    bytes=$("$KVD" sessions show s --data-dir "$d" | python3 -c "import json,sys; print(json.load(sys.stdin).get('stored_bytes', 0))")
    python3 - "$d.resume" "$tokens" "$policy" "$bytes" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("%-8s %-10s %12.1f %14.1f %12s" % (sys.argv[2], sys.argv[3], int(sys.argv[4]) / 2**20,
                                         r["restore_seconds"] * 1000, r["path"]))
PY
  done
done
