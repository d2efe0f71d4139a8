#!/usr/bin/env bash
# A durable session continues bit-identically across process restarts, with the real models:
# the logits of every generated step of a 3-turn conversation are compared byte for byte
# between one uninterrupted process and (a) three processes, one per turn, each exiting
# cleanly, and (b) a process killed with SIGKILL right after it acknowledged turn 2, then a
# new process for turn 3. Also checks that the resumed process reports where the state came
# from (rocksdb), and that a checkpoint refuses to load on another model.
set -uo pipefail
KVD="$1"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# The sandboxes here keep TEST_TMPDIR after a test ends; what this test wrote goes.
trap 'rm -rf "${TEST_TMPDIR:?}"/*' EXIT
M1="Name three rivers in Europe."
M2="Which one is the longest?"
M3="How long is it, in kilometres?"

run_case() {  # run_case MODEL PRECISION
  local model="$1" precision="$2" dir="$TEST_TMPDIR/$1-$2"
  local common=(--model "$model" --precision "$precision" --temperature 0 --max-tokens 24
                --threads 2 --jsonl)
  rm -rf "$dir"; mkdir -p "$dir"
  # Uninterrupted.
  "$KVD" chat "${common[@]}" --data-dir "$dir/a" --session s --dump-logits "$dir/a.logits" \
    "$M1" "$M2" "$M3" > "$dir/a.jsonl" || fail "$model/$precision: uninterrupted run failed"
  # One process per turn, clean exits.
  for m in "$M1" "$M2" "$M3"; do
    "$KVD" chat "${common[@]}" --data-dir "$dir/b" --session s --dump-logits "$dir/b.logits" \
      "$m" >> "$dir/b.jsonl" || fail "$model/$precision: per-turn process failed"
  done
  cmp -s "$dir/a.logits" "$dir/b.logits" ||
    fail "$model/$precision: logits differ after clean restarts"
  grep -q '"path":"rocksdb"' "$dir/b.jsonl" ||
    fail "$model/$precision: restarted process did not restore from rocksdb: $(cat "$dir/b.jsonl")"
  # kill -9 after turn 2 is acknowledged.
  mkfifo "$dir/in"
  "$KVD" chat "${common[@]}" --data-dir "$dir/c" --session s --dump-logits "$dir/c.logits" \
    < "$dir/in" > "$dir/c.jsonl" &
  local pid=$!
  exec 7> "$dir/in"
  printf '%s\n%s\n' "$M1" "$M2" >&7
  for _ in $(seq 1 600); do
    [[ $(wc -l < "$dir/c.jsonl") -ge 2 ]] && break
    sleep 0.1
  done
  kill -9 "$pid"; wait "$pid" 2>/dev/null
  exec 7>&-
  [[ $(wc -l < "$dir/c.jsonl") -ge 2 ]] || fail "$model/$precision: turn 2 never acknowledged"
  "$KVD" chat "${common[@]}" --data-dir "$dir/c" --session s --dump-logits "$dir/c.logits" \
    "$M3" >> "$dir/c.jsonl" || fail "$model/$precision: run after kill -9 failed"
  cmp -s "$dir/a.logits" "$dir/c.logits" ||
    fail "$model/$precision: logits differ after kill -9"
  [[ -s "$dir/a.logits" ]] || fail "$model/$precision: no logits written"
  echo "$model/$precision: $(stat -c %s "$dir/a.logits") bytes of logits identical;" \
    "resume: $(tail -1 "$dir/c.jsonl" | grep -o '"restore_seconds":[0-9.e-]*')"
}

run_case smollm2 fp32
run_case gemma3 bf16

# A checkpoint made with one model is refused by another.
out="$("$KVD" chat --model gemma3 --temperature 0 --max-tokens 4 --threads 2 \
  --data-dir "$TEST_TMPDIR/smollm2-fp32/a" --session s "hi" 2>&1)"; rc=$?
[[ $rc == 1 ]] || fail "model mismatch: exit $rc, want 1"
[[ "$out" == *FAILED_PRECONDITION* && "$out" == *fingerprint* ]] ||
  fail "model mismatch: unclear error: $out"

if [[ $failures -gt 0 ]]; then echo "$failures failure(s)"; exit 1; fi
echo PASS
