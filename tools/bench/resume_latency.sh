#!/usr/bin/env bash
# Resume latency of durable sessions, per checkpoint policy, session length and storage tier,
# and whether `--policy auto` (the planner's choice from this machine's measured rates) picked
# the fastest: the bar of docs/PLANNER.md ("Resume: measured").
#
# For each length N and policy, a session of about N tokens is created by one `kvd chat`
# process (a long first message). Then it is resumed twice:
#   disk  by a new process: the checkpoint comes from RocksDB. Before it, the database's files
#         are dropped from the page cache (posix_fadvise DONTNEED, no privileges needed), so
#         the read comes from the device.
#   dram  by that process's next turn after `--suspend-between-turns` demoted the session: the
#         checkpoint comes from the DRAM tier of the same process.
# `kvd chat --jsonl` reports `restore_seconds`: reading the checkpoint and rebuilding the K/V
# (copying it back for kv, recomputing it for kv-direct and stride:k, re-prefilling for tokens).
#
# usage: tools/bench/resume_latency.sh [OUT_DIR]
#   KVD=bazel-bin/tools/kvd/kvd MODEL=smollm2 LENGTHS="1024 4096 8000" \
#   POLICIES="kv kv-direct stride:4 tokens auto" REPEATS=5 tools/bench/resume_latency.sh /tmp/resume
# Writes OUT_DIR/resume.tsv (one line per measurement) and prints the table of medians and the
# summary.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${1:-/tmp/kvd-resume-latency}"
KVD="${KVD:-bazel-bin/tools/kvd/kvd}"
MODEL="${MODEL:-smollm2}"
read -r -a LENGTHS <<< "${LENGTHS:-1024 4096 8000}"
read -r -a POLICIES <<< "${POLICIES:-kv kv-direct stride:4 tokens auto}"
REPEATS="${REPEATS:-5}"
EXTRA=(${KVD_FLAGS:-})
mkdir -p "$OUT"
TSV="$OUT/resume.tsv"
CAL="$OUT/calibration"  # one data dir whose calibration.json every auto run shares
mkdir -p "$CAL"
printf "length\ttier\tpolicy\tstored_policy\tsession_tokens\tstored_bytes\trestore_ms\tpath\n" > "$TSV"
COMMON=(--model "$MODEL" --temperature 0 --max-tokens 1 --jsonl --raw "${EXTRA[@]}")

# A first message of about N tokens (SmolLM2's tokenizer makes ~2.9 tokens of each " wordK";
# the table reports the real session length).
message() {
  python3 -c "import sys; print(' '.join(['word%d' % (i % 97) for i in range(int(int(sys.argv[1]) / 2.9))]))" "$1"
}
drop_page_cache() {
  sync
  python3 - "$1" <<'PY'
import os, sys
for root, _, files in os.walk(sys.argv[1]):
    for f in files:
        fd = os.open(os.path.join(root, f), os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
PY
}
field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }
record() {  # length tier policy data_dir jsonl_line
  local stored tokens bytes
  stored=$("$KVD" sessions show s --data-dir "$4" | python3 -c "import json,sys; m=json.load(sys.stdin); print(m['policy'], m.get('stored_bytes', 0))")
  printf "%s\t%s\t%s\t%s\t%s\t%s\t%.1f\t%s\n" "$1" "$2" "$3" "${stored% *}" \
    "$(field "$5" session_tokens)" "${stored#* }" \
    "$(python3 -c "print(float('$(field "$5" restore_seconds)') * 1000)")" \
    "$(field "$5" path)" >> "$TSV"
  tail -1 "$TSV"
}

echo "kvd resume latency: $MODEL, lengths ${LENGTHS[*]}, policies ${POLICIES[*]} ($(date -u +%FT%TZ))"
dir_of() { echo "$OUT/$1-${2/:/}"; }
for n in "${LENGTHS[@]}"; do
  msg="$(message "$n")"
  for policy in "${POLICIES[@]}"; do
    d="$(dir_of "$n" "$policy")"
    rm -rf "$d"
    mkdir -p "$d"
    [[ "$policy" == auto ]] && cp "$CAL/calibration.json" "$d/" 2>/dev/null || true
    "$KVD" chat "${COMMON[@]}" --policy "$policy" --data-dir "$d" --session s "$msg" \
      > "$d/create.jsonl"
    [[ "$policy" == auto && ! -f "$CAL/calibration.json" ]] && cp "$d/calibration.json" "$CAL/"
  done
  # Each repeat: for every policy in turn (so drift in the machine's load reaches them all
  # alike), a new process whose turn 1 resumes from disk; the session is then demoted and
  # turn 2 resumes from DRAM. Slow resumes (over 2 s: noise is small next to them) are
  # measured once.
  slow=()
  for ((rep = 0; rep < REPEATS; rep++)); do
    for policy in "${POLICIES[@]}"; do
      [[ " ${slow[*]} " == *" $policy "* ]] && continue
      d="$(dir_of "$n" "$policy")"
      drop_page_cache "$d/sessions"
      "$KVD" chat "${COMMON[@]}" --data-dir "$d" --session s --suspend-between-turns \
        "next" "again" > "$d/resume.jsonl"
      record "$n" disk "$policy" "$d" "$(sed -n 1p "$d/resume.jsonl")"
      record "$n" dram "$policy" "$d" "$(sed -n 2p "$d/resume.jsonl")"
      python3 -c "import json,sys; sys.exit(json.loads(sys.argv[1])['restore_seconds'] > 2)" \
        "$(sed -n 1p "$d/resume.jsonl")" || slow+=("$policy")
    done
  done
done

python3 - "$TSV" <<'PY'
import collections, csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
print()
policies = list(dict.fromkeys(r["policy"] for r in rows))
print("restore ms, median (samples), reading the checkpoint + rebuilding the K/V:\n")
print("| length | tier | " + " | ".join(policies) + " | auto chose | auto / best | auto / best of {kv, tokens} |")
print("|---" * (len(policies) + 5) + "|")
cells = collections.OrderedDict()
for r in rows:
    cell = cells.setdefault((int(r["length"]), r["tier"]), {})
    cell.setdefault(r["policy"], dict(r, samples=[]))["samples"].append(float(r["restore_ms"]))
for by in cells.values():
    for r in by.values():
        r["restore_ms"] = statistics.median(r["samples"])
fastest = within = n = 0
for (length, tier), by in cells.items():
    fixed = {p: float(r["restore_ms"]) for p, r in by.items() if p != "auto"}
    line = "| %d | %s | " % (length, tier) + " | ".join(
        "%.1f (%d)" % (r["restore_ms"], len(r["samples"])) for r in by.values())
    if "auto" in by and fixed:
        auto = float(by["auto"]["restore_ms"])
        best = min(fixed.values())
        base = min(v for p, v in fixed.items() if p in ("kv", "tokens")) if any(p in fixed for p in ("kv", "tokens")) else best
        n += 1
        # Right when the policy auto chose is the one whose own session resumed fastest.
        fastest += by["auto"]["stored_policy"] == min(fixed, key=fixed.get)
        within += auto <= base * 1.10
        line += " | %s | %.2f | %.2f |" % (by["auto"]["stored_policy"], auto / best, auto / base)
    print(line)
if n:
    print("\nauto chose the measured fastest policy in %d of %d cells; its resume was within 10%% "
          "of the best of {kv, tokens} in %d of %d" % (fastest, n, within, n))
PY
