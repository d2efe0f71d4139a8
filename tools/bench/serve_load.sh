#!/usr/bin/env bash
# The serving load test of docs/BENCHMARKS.md ("Serving: 32 concurrent sessions"): `kvd bench
# serve` drives SESSIONS simulated users for DURATION seconds, first against `kvd serve` (each
# continuation sends only the new message with its session_id), then, with the same prompts,
# seed and max_tokens, against llama.cpp's server (llama-cpp-python) in --stateless mode (the
# whole conversation every request, as it has no sessions). The server's RSS is sampled once a
# second; machine, date and load averages are recorded.
#
#   tools/bench/serve_load.sh [out_dir]
#   DURATION=120 DRAIN=120 SESSIONS=32 KVD=/path/to/kvd LLAMA=0 tools/bench/serve_load.sh
#
# Needs: a built kvd (bazel build //tools/kvd), and for the llama.cpp half
# `pip install 'llama-cpp-python[server]'` (a measurement tool, not a kvd dependency).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${1:-/tmp/kvd-serve-bench}"
KVD="${KVD:-bazel-bin/tools/kvd/kvd}"
DURATION="${DURATION:-300}"
SESSIONS="${SESSIONS:-32}"
MAX_TOKENS="${MAX_TOKENS:-64}"
NEW_FRACTION="${NEW_FRACTION:-0.3}"
DRAIN="${DRAIN:-120}"  # seconds after DURATION before unfinished requests are cut
LLAMA="${LLAMA:-1}"
SERVE_FLAGS="${SERVE_FLAGS:-}"  # extra `kvd serve` flags, e.g. "--dram-budget-mb 128"
MODEL_FILE="${MODEL_FILE:-$HOME/.cache/kvd/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
mkdir -p "$OUT"
rm -rf "$OUT/data"

{
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "machine: $(nproc) vCPU, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)," \
    "$(free -g | awk '/Mem:/{print $2}') GiB"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT/machine.txt"

BENCH=("$KVD" bench serve --sessions "$SESSIONS" --duration "$DURATION" --new-fraction
       "$NEW_FRACTION" --max-tokens "$MAX_TOKENS" --temperature 0 --seed 1 --stream --drain "$DRAIN")
SERVER=""
trap '[[ -n "$SERVER" ]] && kill -TERM "$SERVER" 2>/dev/null' EXIT

wait_port() {  # wait_port LOG REGEX: prints the port once the log shows it
  for _ in $(seq 1 600); do
    p="$(grep -Eo "$2" "$1" | head -1 | grep -Eo '[0-9]+$' || true)"
    [[ -n "$p" ]] && { echo "$p"; return 0; }
    sleep 0.1
  done
  echo "server did not start: $(tail -5 "$1")" >&2
  return 1
}

echo "== kvd serve"
"$KVD" serve --model smollm2 --precision bf16 --max-inflight 4 --max-queue 64 --http-port 0 \
  --grpc-port -1 --threads 2 --data-dir "$OUT/data" $SERVE_FLAGS 2> "$OUT/kvd_serve.log" &
SERVER=$!
PORT="$(wait_port "$OUT/kvd_serve.log" 'http://127.0.0.1:[0-9]+')"
"${BENCH[@]}" --url "http://127.0.0.1:$PORT" --server-pid "$SERVER" --json "$OUT/kvd.json" |
  tee "$OUT/kvd.md"
curl -s "http://127.0.0.1:$PORT/metrics" |
  grep -E '^(kvd_(session_resumes_total|sessions|store_bytes|engine_hot_bytes|http_rejected|kv_pool|heap|process)|process_resident)' |
  tee "$OUT/kvd_metrics.txt" || true
kill -TERM "$SERVER"
wait "$SERVER" || true
SERVER=""
du -sh "$OUT/data" | tee -a "$OUT/kvd_metrics.txt"

if [[ "$LLAMA" == 1 ]]; then
  echo "== llama.cpp server (llama-cpp-python $(python3 -c 'import llama_cpp; print(llama_cpp.__version__)'))"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/machine.txt"
  # --interrupt_requests False: by default a waiting request cuts the running stream short;
  # we want every request answered in turn (it serves one at a time).
  PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0));
print(s.getsockname()[1])')"
  python3 -m llama_cpp.server --model "$MODEL_FILE" --n_ctx 8192 --n_threads 2 \
    --host 127.0.0.1 --port "$PORT" --interrupt_requests False > "$OUT/llama_serve.log" 2>&1 &
  SERVER=$!
  wait_port "$OUT/llama_serve.log" 'Uvicorn running on http://127.0.0.1:[0-9]+' > /dev/null
  "${BENCH[@]}" --url "http://127.0.0.1:$PORT" --stateless --server-pid "$SERVER" \
    --json "$OUT/llama.json" | tee "$OUT/llama.md"
  kill -TERM "$SERVER"
  wait "$SERVER" || true
  SERVER=""
fi
