#!/usr/bin/env bash
# End-to-end test of `kvd plan` with the real default model (SmolLM2-135M): the table lists
# every default policy with its figures, marks exactly one chosen row, honours --budget, and
# --measure adds measured columns; bad flags fail with a message.
set -uo pipefail
KVD="$1"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
expect_contains() {  # expect_contains NAME HAYSTACK NEEDLE
  [[ "$2" == *"$3"* ]] || fail "$1: output does not contain '$3'; got: $2"
}
CAL="$TEST_TMPDIR/calibration.json"

out="$("$KVD" plan --tokens 128 --threads 2 --calibration "$CAL" 2>&1)" \
  || fail "kvd plan exited $?: $out"
for policy in kv kv-direct stride:2 stride:3 stride:4 stride:6 stride:8 stride:12 tokens; do
  # A row: "| policy | bytes/token | bytes read | GFLOP | read s | compute s | est. from |
  #          rebuild s | mark |" (est. from: the measured code paths, or the FLOP model)
  grep -Eq "^\| ${policy} \| [0-9.]+ \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [a-z-]+ \| [0-9.]+ \|" \
    <<<"$out" || fail "no table row for policy $policy; got: $out"
done
chosen_rows="$(grep -c '<- chosen' <<<"$out")"
[[ "$chosen_rows" == 1 ]] || fail "want exactly one chosen row, got $chosen_rows: $out"
expect_contains "chosen line" "$out" "chosen: "
[[ -s "$CAL" ]] || fail "the calibration file $CAL was not written"
grep -q '"flops_per_s"' "$CAL" || fail "calibration file has no rates: $(cat "$CAL")"

# A budget of 5 bytes/token leaves only tokens (4 B/token of ids); the calibration is reused.
out="$("$KVD" plan --tokens 128 --threads 2 --calibration "$CAL" --budget 5 2>&1)" \
  || fail "kvd plan --budget 5 exited $?: $out"
grep -Eq '^\| tokens .*<- chosen' <<<"$out" || fail "budget 5: tokens not chosen: $out"
grep -Eq '^\| kv \| .*over budget' <<<"$out" || fail "budget 5: kv not over budget: $out"

out="$("$KVD" plan --tokens 128 --threads 2 --calibration "$CAL" --budget 3 2>&1)"; rc=$?
[[ $rc == 1 ]] || fail "budget 3: exit $rc, want 1"
expect_contains "budget 3" "$out" "no policy fits"

out="$("$KVD" plan --tokens 64 --threads 2 --calibration "$CAL" --measure 2>&1)" \
  || fail "kvd plan --measure exited $?: $out"
expect_contains "--measure" "$out" "measured compute s"
expect_contains "--measure" "$out" "MODELLED read time"

out="$("$KVD" plan --tier tape 2>&1)"; rc=$?
[[ $rc == 1 ]] || fail "bad tier: exit $rc, want 1"
expect_contains "bad tier" "$out" "tape"

out="$("$KVD" plan --help 2>&1)" || fail "kvd plan --help exited $?"
for flag in --model --tokens --tier --bandwidth --budget --measure --calibration; do
  expect_contains "plan --help" "$out" "$flag"
done

if ((failures)); then
  echo "$failures failure(s)"
  exit 1
fi
echo "all kvd plan checks passed"
