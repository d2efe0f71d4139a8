#!/usr/bin/env bash
# End-to-end test of the kvd command line with the real default model: help, error messages
# for bad input, and reproducible generation (same seed, same text).
set -uo pipefail
KVD="$1"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# The sandboxes here keep TEST_TMPDIR after a test ends; what this test wrote goes.
trap 'rm -rf "${TEST_TMPDIR:?}"/*' EXIT
expect_contains() {  # expect_contains NAME HAYSTACK NEEDLE
  [[ "$2" == *"$3"* ]] || fail "$1: output does not contain '$3'; got: $2"
}

out="$("$KVD" --help 2>&1)" || fail "kvd --help exited $?"
expect_contains "kvd --help" "$out" "generate"

out="$("$KVD" generate --help 2>&1)" || fail "kvd generate --help exited $?"
for flag in --model --temperature --top-p --seed --stop --precision --threads --max-tokens; do
  expect_contains "generate --help" "$out" "$flag"
done

out="$("$KVD" generate --no-such-flag x 2>&1)"; rc=$?
[[ $rc == 2 ]] || fail "unknown flag: exit $rc, want 2"
expect_contains "unknown flag" "$out" "unknown flag --no-such-flag"

out="$("$KVD" frobnicate 2>&1)"; rc=$?
[[ $rc == 2 ]] || fail "unknown command: exit $rc, want 2"

out="$("$KVD" generate --model /nonexistent/model.gguf hi 2>&1)"; rc=$?
[[ $rc == 1 ]] || fail "missing model: exit $rc, want 1"
expect_contains "missing model" "$out" "/nonexistent/model.gguf"

bad="$TEST_TMPDIR/garbage.gguf"
head -c 4096 /dev/urandom > "$bad"
out="$("$KVD" generate --model "$bad" hi 2>&1)"; rc=$?
[[ $rc == 1 ]] || fail "garbage model: exit $rc, want 1"
expect_contains "garbage model" "$out" "garbage.gguf"

out="$("$KVD" generate --temperature -1 hi 2>&1)"; rc=$?
[[ $rc == 1 ]] || fail "negative temperature: exit $rc, want 1"
expect_contains "negative temperature" "$out" "temperature"

# Tensor parallelism: contradicting or bad flags, and too few GPUs, fail before the model loads,
# naming the flag.
out="$("$KVD" generate --backend cpu --tensor-parallel-size 2 hi 2>&1)"; rc=$?
[[ $rc == 1 ]] || fail "TP with --backend cpu: exit $rc, want 1"
expect_contains "TP with --backend cpu" "$out" "--backend cpu"
out="$("$KVD" generate --tensor-parallel-size 0 hi 2>&1)"; rc=$?
[[ $rc == 1 ]] || fail "TP size 0: exit $rc, want 1"
expect_contains "TP size 0" "$out" "--tensor-parallel-size"
gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU ' || true)
if (( gpus < 2 )); then
  out="$("$KVD" generate --tensor-parallel-size 2 hi 2>&1)"; rc=$?
  [[ $rc == 1 ]] || fail "TP 2 with $gpus GPUs: exit $rc, want 1"
  expect_contains "TP 2 with $gpus GPUs" "$out" "--tensor-parallel-size 2"
fi

# Reproducible sampling: the same seed gives the same text; greedy ignores the seed.
gen() { "$KVD" generate --quiet --max-tokens 24 --threads 2 "$@" "Name three colors." 2>&1; }
a="$(gen --seed 5)" || fail "generate exited $?"
b="$(gen --seed 5)"
[[ -n "$a" ]] || fail "empty generation"
[[ "$a" == "$b" ]] || fail "same seed, different text: '$a' vs '$b'"
g1="$(gen --temperature 0 --seed 1)"
g2="$(gen --temperature 0 --seed 2)"
[[ "$g1" == "$g2" ]] || fail "greedy depends on the seed: '$g1' vs '$g2'"
# Thread count and precision of the reference mode do not change greedy output.
g3="$(gen --temperature 0 --threads 1)"
[[ "$g1" == "$g3" ]] || fail "greedy depends on the thread count: '$g1' vs '$g3'"

# A stop string ends the reply right before it. First check (without --stop) that the greedy
# continuation does contain the stop string, so the second check can fail.
free="$("$KVD" generate --quiet --temperature 0 --max-tokens 24 \
        --prompt "Apples, pears, plums, cherries" 2>&1)"
[[ "$free" == *","* ]] || fail "greedy continuation has no ',' to stop at: '$free'"
s="$("$KVD" generate --quiet --temperature 0 --max-tokens 24 --stop "," \
     --prompt "Apples, pears, plums, cherries" 2>&1)"
[[ "$s" != *","* ]] || fail "stop string ',' was emitted: '$s'"
[[ "$free" == "$s"* ]] || fail "stopped text '$s' is not a prefix of the free text '$free'"

# A session's first turn that is refused stores nothing: no empty session is left behind, and the
# same name then starts a real one.
data="$TEST_TMPDIR/chat-data"
long="$(printf 'hello %.0s' {1..9000})"  # more tokens than SmolLM2's 8192-token context
out="$("$KVD" chat --data-dir "$data" --session ghost --max-tokens 2 "$long" 2>&1)"; rc=$?
[[ $rc == 1 ]] || fail "over-long first turn: exit $rc, want 1; got: $out"
expect_contains "over-long first turn" "$out" "context"
out="$("$KVD" sessions --data-dir "$data" ls 2>&1)"
[[ "$out" != *ghost* ]] || fail "a refused first turn left session ghost: $out"
"$KVD" chat --data-dir "$data" --session ghost --max-tokens 2 "Hi" >/dev/null 2>&1 \
  || fail "kvd chat after a refused first turn exited $?"
out="$("$KVD" sessions --data-dir "$data" ls 2>&1)"
expect_contains "session after a committed turn" "$out" "ghost"

# Salvage: every session of every tenant exported at once (DIR/TENANT/NAME.kvds), then imported
# into a fresh directory, each into its tenant, continues where it was.
"$KVD" chat --data-dir "$data" --session second --max-tokens 2 "Hello" >/dev/null 2>&1 \
  || fail "kvd chat --session second exited $?"
"$KVD" chat --data-dir "$data" --tenant acme --session third --max-tokens 2 "Hey" >/dev/null 2>&1 \
  || fail "kvd chat --tenant acme exited $?"
out="$("$KVD" sessions --data-dir "$data" export --all "$TEST_TMPDIR/salvage" 2>&1)" \
  || fail "sessions export --all exited $?: $out"
expect_contains "export --all" "$out" "exported 3 session(s)"
for f in local/ghost local/second acme/third; do
  [[ -s "$TEST_TMPDIR/salvage/$f.kvds" ]] || fail "export --all wrote no $f.kvds"
done
out="$("$KVD" sessions --data-dir "$TEST_TMPDIR/fresh" import --all "$TEST_TMPDIR/salvage" 2>&1)" \
  || fail "sessions import --all exited $?: $out"
expect_contains "import --all" "$out" "imported 3 session(s)"
for t_s in "local second" "acme third"; do
  read -r t s <<<"$t_s"
  a="$("$KVD" sessions --data-dir "$data" --tenant "$t" show "$s" 2>&1)"
  b="$("$KVD" sessions --data-dir "$TEST_TMPDIR/fresh" --tenant "$t" show "$s" 2>&1)"
  expect_contains "imported copy of $t/$s" "$b" "\"token_count\""
  [[ "$(grep token_count <<<"$a")" == "$(grep token_count <<<"$b")" ]] \
    || fail "the imported copy of $t/$s differs: $a vs $b"
done

# Out-of-range numbers are refused with the flag's range, before anything is loaded or allocated
# (a huge --threads crashed generate, --repetitions 0 crashed bench, a huge --batch ran out of
# memory).
for cmd in "generate --threads 100000 hi" "generate --threads -3 hi" "plan --threads 5000" \
           "bench --repetitions 0" "bench --batch 100000" "bench --prompt-tokens 0"; do
  # shellcheck disable=SC2086
  out="$("$KVD" $cmd 2>&1)"; rc=$?
  [[ $rc == 1 ]] || fail "kvd $cmd: exit $rc, want 1: $out"
  [[ "$out" == *"must be between"* || "$out" == *"wants integers in"* ]] \
    || fail "kvd $cmd does not give the flag's range: $out"
done

# kvd chat --server with nothing listening says what to check.
out="$("$KVD" chat --server http://127.0.0.1:1 --session x hi 2>&1)"; rc=$?
[[ $rc == 1 ]] || fail "chat --server to a closed port: exit $rc, want 1"
expect_contains "chat --server to a closed port" "$out" "cannot connect"

# Reading a data directory that does not exist (a typo) creates nothing there.
nowhere="$TEST_TMPDIR/no-such-data-dir"
out="$("$KVD" sessions --data-dir "$nowhere" ls 2>&1)" || fail "sessions ls of a missing dir exited $?"
expect_contains "sessions ls of a missing dir" "$out" "nothing was ever stored"
out="$("$KVD" sessions --data-dir "$nowhere" show x 2>&1)"; rc=$?
[[ $rc == 1 ]] || fail "sessions show in a missing dir: exit $rc, want 1"
expect_contains "sessions show in a missing dir" "$out" "check --data-dir"
[[ ! -e "$nowhere" ]] || fail "reading $nowhere created it"

# Ownership on the kvd chat path: a session owned by node a (--node-id a) is not written by a
# process of another node, or a standalone one; nothing of the refused turn is stored.
"$KVD" chat --data-dir "$data" --node-id a --session owned --max-tokens 2 "Hi" >/dev/null 2>&1 \
  || fail "kvd chat --node-id a exited $?"
before="$("$KVD" sessions --data-dir "$data" show owned 2>&1)"
expect_contains "owned session" "$before" '"owner_node": "a"'
for other in "--node-id b" ""; do
  out="$("$KVD" chat --data-dir "$data" $other --session owned --max-tokens 2 "Again" 2>&1)"; rc=$?
  [[ $rc == 1 ]] || fail "turn of a session owned by a from '${other:-standalone}': exit $rc"
  expect_contains "turn from '${other:-standalone}'" "$out" "owned by node 'a'"
done
after="$("$KVD" sessions --data-dir "$data" show owned 2>&1)"
[[ "$before" == "$after" ]] || fail "a refused turn changed the session: $after"
# The operator's way out (a node renamed or retired): adopt it here, one epoch on; then it
# continues.
out="$("$KVD" sessions --data-dir "$data" adopt owned 2>&1)" || fail "sessions adopt: $out"
expect_contains "sessions adopt" "$out" "epoch 2"
"$KVD" chat --data-dir "$data" --session owned --max-tokens 2 "Again" >/dev/null 2>&1 \
  || fail "kvd chat after adopt exited $?"

if ((failures)); then
  echo "$failures failure(s)"
  exit 1
fi
echo "all kvd CLI checks passed"
