#!/usr/bin/env bash
# End-to-end test of the clients of a running `kvd serve` (real model, port 0):
#  - `kvd bench serve` with 4 users for 10 s (new and continued sessions, streaming) reports zero
#    failures, and some continued conversations succeeded;
#  - `kvd chat --server` holds a two-turn conversation in a session, sending only the new message
#    (the second answer needs the first turn's context);
#  - against a server with one slot and no queue, bench counts 429s apart from failures and
#    `kvd chat --server` shows a refusal as "server busy, retry after N s".
set -uo pipefail
KVD="$1"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
T="$(mktemp -d "${TEST_TMPDIR:-/tmp}/bench.XXXXXX")"
PIDS=()
# The servers stop and their data goes: the sandboxes here keep TEST_TMPDIR.
trap 'for p in "${PIDS[@]}" $(cat "$T/restarted.pid" 2>/dev/null); do kill -TERM "$p" 2>/dev/null; done
      wait; rm -rf "$T"' EXIT

start() {  # start LOG FLAGS...: starts a server, sets PID and PORT
  local log="$1"
  shift
  "$KVD" serve --model smollm2 --http-port 0 --grpc-port -1 --threads 2 "$@" 2> "$log" &
  PID=$!
  PIDS+=("$PID")
  PORT=""
  for _ in $(seq 1 300); do
    PORT="$(grep -o 'http://127.0.0.1:[0-9]*' "$log" | head -1 | sed 's/.*://')"
    [[ -n "$PORT" ]] && break
    sleep 0.1
  done
  [[ -n "$PORT" ]] || { fail "server did not start: $(cat "$log")"; exit 1; }
}

# ---- a normal server: load with a restart in the middle, then chat ----
FLAGS1=(--data-dir "$T/data1" --max-inflight 4 --max-queue 16)
start "$T/serve1.log" "${FLAGS1[@]}"
URL="http://127.0.0.1:$PORT"
# The event: stop the server, start a new one on the same port and data, wait until it is ready.
cat > "$T/restart.sh" <<EOF
kill -TERM $PID
while kill -0 $PID 2>/dev/null && ! grep -q '^State:.*Z' /proc/$PID/status; do sleep 0.1; done
"$KVD" serve --model smollm2 --http-port $PORT --grpc-port -1 --threads 2 ${FLAGS1[*]} \\
  2> "$T/serve1b.log" & echo \$! > "$T/restarted.pid"
for i in \$(seq 1 300); do curl -sf "$URL/readyz" > /dev/null && exit 0; sleep 0.1; done; exit 1
EOF
"$KVD" bench serve --url "$URL" --sessions 4 --duration 12 --new-fraction 0.3 --max-tokens 16 \
  --stream --server-pid "$PID" --json "$T/bench.json" --event-at 6 --event-name restart \
  --event-cmd "sh $T/restart.sh" > "$T/bench.out" 2> "$T/bench.err"
rc=$?
cat "$T/bench.out"
[[ $rc == 0 ]] || fail "bench serve exit $rc: $(cat "$T/bench.err")"
grep -q "RESULT failures=0 rejected_429=0" "$T/bench.out" || fail "bench reported failures"
python3 - "$T/bench.json" "$T/bench.out" <<'PY' || fail "bench JSON"
import json, sys
j = json.load(open(sys.argv[1]))
s = j["summary"]
assert s["all"]["failures"] == 0, s
assert s["all"]["ok"] >= 4, s                      # every user got at least one answer
assert s["continued"]["ok"] >= 1, s                # a stored session was continued
assert s["all"]["output_tokens"] > 0, s
assert s["all"]["ttft_s"]["p50"] > 0, s
assert j["server_rss_mib"]["max"] > 0, j
assert s["event"]["ran"] and s["event"]["exit_code"] == 0, s["event"]
ok = [r for r in j["requests"] if r["ok"]]
assert all(0 < r["output_tokens"] <= 16 for r in ok), ok  # max_tokens honoured
assert all(r["ttft_s"] <= r["latency_s"] for r in ok)
# Every turn says where the server found its session: a first turn a new one; a continued one
# before the restart in memory (hot) or in a tier it was demoted to (DRAM, RocksDB); the first
# turn of a conversation after the restart from storage: RocksDB, or the DRAM tier when the
# node prefetched it from RocksDB while the request waited. Never hot there (the new process
# had nothing in memory) and never re-prefilled (the residuals were good).
before = [r for r in ok if r["events_seen"] == 0]
assert all(r["state"] == "new" if r["turn"] == 1 else r["state"] in ("hot", "dram", "rocksdb")
           for r in before), before
assert any(r["state"] == "hot" for r in before), before
first = [r for r in ok if r["first_after_event"]]
assert first and all(r["state"] in ("rocksdb", "dram") for r in first), first
assert "| first after restart: " in open(sys.argv[2]).read()
PY

out="$("$KVD" chat --server "$URL" --session s --temperature 0 --max-tokens 24 \
  "What is the capital of France?" "And of Germany?" 2> "$T/chat.err")"
rc=$?
echo "$out"
[[ $rc == 0 ]] || fail "chat --server exit $rc: $(cat "$T/chat.err")"
first="$(echo "$out" | head -1)"
[[ "$first" == *Paris* ]] || fail "turn 1: $first"
[[ "$(echo "$out" | tail -n +2)" == *Berlin* ]] || fail "turn 2 (only the new message sent): $out"
grep -q '"session":"s"' "$T/serve1b.log" || fail "the server saw no request in session s"

# ---- one slot, no queue: deliberate refusals ----
start "$T/serve2.log" --data-dir "$T/data2" --max-inflight 1 --max-queue 0
URL="http://127.0.0.1:$PORT"
"$KVD" bench serve --url "$URL" --sessions 3 --duration 4 --max-tokens 16 --stream \
  > "$T/bench2.out" 2> "$T/bench2.err"
cat "$T/bench2.out"
grep -Eq "RESULT failures=0 rejected_429=[1-9]" "$T/bench2.out" ||
  fail "want 429s counted apart from failures: $(cat "$T/bench2.out" "$T/bench2.err")"

"$KVD" chat --server "$URL" --session long --temperature 0 --max-tokens 400 --ignore-eos \
  "Count to one hundred." > /dev/null 2>&1 &
LONG=$!
busy=0
for _ in $(seq 1 100); do
  if curl -s "$URL/metrics" | grep -q '^kvd_http_inflight_generations 1'; then busy=1; break; fi
  sleep 0.1
done
[[ $busy == 1 ]] || fail "the long generation never ran"
err="$("$KVD" chat --server "$URL" --session other "Hi" 2>&1 > /dev/null)"
rc=$?
[[ $rc == 1 && "$err" == *"server busy, retry after 1 s"* ]] || fail "refusal: exit $rc: $err"
kill "$LONG" 2>/dev/null
wait "$LONG" 2>/dev/null

if [[ $failures -gt 0 ]]; then echo "$failures failure(s)"; exit 1; fi
echo PASS
