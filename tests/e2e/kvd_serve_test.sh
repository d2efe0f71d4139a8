#!/usr/bin/env bash
# End-to-end test of `kvd serve` with the real default model: it starts from a --config file on
# a port the OS picks, answers /healthz, /v1/models and a two-turn chat in a session (the second
# request carries only the new message), stops cleanly on SIGTERM, and a new server continues the
# same session from disk.
set -uo pipefail
KVD="$1"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# The sandboxes here keep TEST_TMPDIR after a test ends; what this test wrote goes.
trap 'rm -rf "${TEST_TMPDIR:?}"/*' EXIT
DATA="$TEST_TMPDIR/data"
CONFIG="$TEST_TMPDIR/kvd.json"
cat > "$CONFIG" <<JSON
{"model": "smollm2", "http-port": 0, "grpc-port": 0, "threads": 2, "data-dir": "$DATA",
 "http-read-timeout": 2}
JSON

start() {  # start LOG [FLAG...]: starts the server, sets PID and PORT (HTTP or HTTPS)
  local log="$1"; shift
  "$KVD" serve --config "$CONFIG" "$@" 2> "$log" &
  PID=$!
  PORT=""
  for _ in $(seq 1 300); do
    PORT="$(grep -o 'https*://127.0.0.1:[0-9]*' "$log" | head -1 | sed 's/.*://')"
    [[ -n "$PORT" ]] && break
    sleep 0.1
  done
  [[ -n "$PORT" ]] || fail "server did not start: $(cat "$log")"
}

chat() {  # chat MESSAGE: prints the reply text
  curl -s "http://127.0.0.1:$PORT/v1/chat/completions" -H 'content-type: application/json' \
    -d "{\"model\":\"smollm2\",\"session_id\":\"trip\",\"temperature\":0,\"max_tokens\":16,
         \"messages\":[{\"role\":\"user\",\"content\":\"$1\"}]}" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])'
}

start "$TEST_TMPDIR/serve1.log"
[[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/healthz")" == 200 ]] ||
  fail "/healthz is not 200"
curl -s "http://127.0.0.1:$PORT/v1/models" | grep -q '"id":"smollm2"' || fail "/v1/models lacks smollm2"
[[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/metrics")" == 200 ]] ||
  fail "/metrics is not open by default"
# A connection that never sends a request is closed after --http-read-timeout (2 s here), so
# idle clients cannot hold the connection threads for long.
if exec 3<>"/dev/tcp/127.0.0.1/$PORT"; then
  # Within 8 s: closed by the 2 s setting, not the 10 s default.
  timeout 8 cat <&3 >/dev/null; rc=$?
  [[ $rc == 0 ]] || fail "an idle connection was not closed within 8 s (cat exit $rc)"
  exec 3<&-
else
  fail "cannot connect to 127.0.0.1:$PORT"
fi
r1="$(chat "What is the capital of France?")"
[[ "$r1" == *Paris* ]] || fail "turn 1: $r1"
r2="$(chat "And of Germany?")"
[[ "$r2" == *Berlin* ]] || fail "turn 2 (only the new message sent): $r2"
kill -TERM "$PID"; wait "$PID"; rc=$?
[[ $rc == 0 ]] || fail "SIGTERM: exit $rc, want 0"
grep -q "SIGTERM, stopping" "$TEST_TMPDIR/serve1.log" || fail "no clean-stop message"

# A new server continues the stored conversation.
start "$TEST_TMPDIR/serve2.log"
r3="$(chat "And of Italy?")"
[[ "$r3" == *Rome* ]] || fail "turn 3 after restart: $r3"
# kvd chat --server: a request the server refuses (400) is the request's fault, not UNAVAILABLE.
out="$("$KVD" chat --server "http://127.0.0.1:$PORT" --session ../x hi 2>&1)"; rc=$?
[[ $rc == 1 && "$out" == *INVALID_ARGUMENT*400* ]] || fail "chat --server bad session: exit $rc: $out"
# One tokenization rule for raw prompts: special-token text parses to the special tokens on
# /v1/completions and in `kvd generate --prompt` alike (a handful of tokens; unparsed, this
# text is well over ten).
RAW='<|im_start|>user\nHi<|im_end|>\n'
http_n="$(curl -s "http://127.0.0.1:$PORT/v1/completions" -H 'content-type: application/json' \
  -d "{\"model\":\"smollm2\",\"prompt\":\"$RAW\",\"max_tokens\":1,\"temperature\":0}" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["usage"]["prompt_tokens"])')"
cli_n="$("$KVD" generate --prompt $'<|im_start|>user\nHi<|im_end|>\n' --max-tokens 1 \
  --temperature 0 --threads 2 2>&1 >/dev/null | grep -o 'prefill [0-9]* tokens' | grep -o '[0-9]*')"
[[ -n "$http_n" && "$http_n" == "$cli_n" && "$http_n" -le 8 ]] ||
  fail "raw prompt tokens: HTTP '$http_n', kvd generate '$cli_n' (want equal and <= 8)"
kill -TERM "$PID"; wait "$PID"
turns="$("$KVD" sessions show trip --data-dir "$DATA" |
  python3 -c 'import json,sys; print(len(json.load(sys.stdin)["turn_ends"]))')"
[[ "$turns" == 3 ]] || fail "stored turns: $turns, want 3"

# TLS: the same server over HTTPS (and gRPC over TLS) with a self-signed certificate.
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 \
  -keyout "$TEST_TMPDIR/key.pem" -out "$TEST_TMPDIR/cert.pem" 2>/dev/null ||
  fail "openssl could not make a test certificate"
start "$TEST_TMPDIR/serve3.log" --tls-cert "$TEST_TMPDIR/cert.pem" --tls-key "$TEST_TMPDIR/key.pem"
[[ "$(curl -sk -o /dev/null -w '%{http_code}' "https://127.0.0.1:$PORT/healthz")" == 200 ]] ||
  fail "HTTPS /healthz is not 200: $(cat "$TEST_TMPDIR/serve3.log")"
[[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/healthz")" != 200 ]] ||
  fail "plain HTTP was served on the TLS port"
kill -TERM "$PID"; wait "$PID"

# --metrics-key closes /metrics behind a bearer key; without it /metrics is open (above).
start "$TEST_TMPDIR/serve4.log" --metrics-key s3cret
code="$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/metrics")"
[[ "$code" == 401 ]] || fail "/metrics without the key: $code, want 401"
code="$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer wrong' \
  "http://127.0.0.1:$PORT/metrics")"
[[ "$code" == 401 ]] || fail "/metrics with a wrong key: $code, want 401"
# Read whole first: under pipefail, `curl | grep -q` fails when grep stops reading early.
metrics="$(curl -s -H 'Authorization: Bearer s3cret' "http://127.0.0.1:$PORT/metrics")"
grep -q '# TYPE kvd_http_requests_total' <<< "$metrics" || fail "/metrics with the key has no metrics"
kill -TERM "$PID"; wait "$PID"

# --create-sessions explicit (a node in a cluster): a turn for an unknown session is 404, not a
# new session.
start "$TEST_TMPDIR/serve5.log" --create-sessions explicit --node-id n1
body="$(curl -s -w '\n%{http_code}' "http://127.0.0.1:$PORT/v1/chat/completions" \
  -H 'content-type: application/json' \
  -d '{"model":"smollm2","session_id":"new-one","max_tokens":2,
       "messages":[{"role":"user","content":"Hi"}]}')"
[[ "$(tail -1 <<< "$body")" == 404 && "$body" == *"create it first"* ]] ||
  fail "--create-sessions explicit: $body"
kill -TERM "$PID"; wait "$PID"
out="$("$KVD" serve --create-sessions sometimes --http-port 0 --grpc-port -1 2>&1)"; rc=$?
[[ $rc == 1 && "$out" == *"--create-sessions"* ]] || fail "bad --create-sessions: exit $rc: $out"

out="$("$KVD" serve --http-read-timeout 0 --http-port 0 --grpc-port -1 2>&1)"; rc=$?
[[ $rc == 1 && "$out" == *"--http-read-timeout"* ]] || fail "bad --http-read-timeout: exit $rc: $out"

out="$("$KVD" serve --config /nonexistent.json 2>&1)"; rc=$?
[[ $rc == 2 && "$out" == */nonexistent.json* ]] || fail "missing config: exit $rc: $out"

if [[ $failures -gt 0 ]]; then echo "$failures failure(s)"; exit 1; fi
echo PASS
