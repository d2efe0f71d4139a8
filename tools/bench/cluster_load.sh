#!/usr/bin/env bash
# The cluster load test of docs/BENCHMARKS.md ("Cluster: 48 users through a router"): `kvd bench
# serve` drives SESSIONS multi-turn users for DURATION seconds through one `kvd router` to NODES
# nodes (tools/cluster/up.sh), then, with the same prompts and seed, straight to one standalone
# `kvd serve` on the same machine. All nodes share this machine's cores, so no speed-up is
# expected; what it measures is what the router adds (its routing time per request, from its
# request log), directory operations per request (its metrics), and how evenly sessions and
# turns spread over the nodes (the directory and the nodes' own metrics).
#
#   tools/bench/cluster_load.sh [out_dir]
#   DURATION=120 SESSIONS=48 NODES=3 tools/bench/cluster_load.sh /tmp/cl
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${1:-/tmp/kvd-cluster-bench}"
KVD="${KVD:-bazel-bin/tools/kvd/kvd}"
DURATION="${DURATION:-120}"
SESSIONS="${SESSIONS:-48}"
NODES="${NODES:-3}"
MAX_TOKENS="${MAX_TOKENS:-32}"
DRAIN="${DRAIN:-120}"
PORT="${PORT:-18400}"
NODE_FLAGS=(--max-inflight 4 --max-queue 64 --threads 2 --precision bf16)
rm -rf "$OUT"
mkdir -p "$OUT"
{
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "machine: $(nproc) vCPU, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)," \
    "$(free -g | awk '/Mem:/{print $2}') GiB"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT/machine.txt"
BENCH=("$KVD" bench serve --model smollm2 --sessions "$SESSIONS" --duration "$DURATION"
       --max-tokens "$MAX_TOKENS" --temperature 0 --seed 1 --stream --drain "$DRAIN")

echo "== through a router to $NODES nodes"
KVD="$KVD" tools/cluster/up.sh --dir "$OUT/cluster" --nodes "$NODES" --port "$PORT" \
  -- "${NODE_FLAGS[@]}" > "$OUT/up.txt"
trap 'tools/cluster/down.sh --dir "$OUT/cluster" > /dev/null 2>&1 || true' EXIT
"${BENCH[@]}" --url "http://127.0.0.1:$PORT" --json "$OUT/router.json" | tee "$OUT/router.md"
curl -s "http://127.0.0.1:$PORT/metrics" > "$OUT/router_metrics.txt"
"$KVD" cluster status --etcd "$(sed -n 's/^etcd: //p' "$OUT/up.txt")" | tee "$OUT/status.txt"
for url in $(grep -Eo 'https?://127.0.0.1:[0-9]+' "$OUT/status.txt"); do
  echo "$url $(curl -s --cacert "$OUT/cluster/certs/ca.pem" "$url/metrics" |
    sed -n 's/^kvd_turns_total{outcome="committed"} //p')"
done > "$OUT/turns_per_node.txt"
tools/cluster/down.sh --dir "$OUT/cluster" > /dev/null
trap - EXIT

echo "== straight to one node"
"$KVD" serve --model smollm2 --http-port 0 --grpc-port -1 --data-dir "$OUT/single" \
  "${NODE_FLAGS[@]}" 2> "$OUT/single.log" &
SERVER=$!
trap 'kill -TERM "$SERVER" 2> /dev/null || true' EXIT
for _ in $(seq 1 600); do
  SPORT="$(grep -Eo 'http://127.0.0.1:[0-9]+' "$OUT/single.log" | head -1 | grep -Eo '[0-9]+$' || true)"
  [[ -n "$SPORT" ]] && break
  sleep 0.1
done
"${BENCH[@]}" --url "http://127.0.0.1:$SPORT" --json "$OUT/single.json" | tee "$OUT/single.md"
kill -TERM "$SERVER"
wait "$SERVER" || true
trap - EXIT

echo "== summary"
python3 - "$OUT" <<'PY'
import json, re, sys, statistics
out = sys.argv[1]
routing = []
for line in open(out + "/cluster/router.log"):
    if line.startswith("{") and '"routing_ms"' in line:
        d = json.loads(line)
        if d.get("path") == "/v1/chat/completions":
            routing.append(d["routing_ms"])
routing.sort()
pct = lambda v, p: v[min(len(v) - 1, int(p / 100 * len(v)))] if v else float("nan")
metrics = open(out + "/router_metrics.txt").read()
total = lambda name: sum(float(x) for x in re.findall(r"^%s(?:\{[^}]*\})? (\S+)$" % name, metrics, re.M))
requests = total("kvd_router_requests_total")
dir_ops = total("kvd_router_directory_ops_total")
print("router routing time per chat request: p50 %.2f ms, p99 %.2f ms (%d requests)" %
      (pct(routing, 50), pct(routing, 99), len(routing)))
print("directory operations per request: %.2f (%d over %d)" % (dir_ops / max(requests, 1), dir_ops, requests))
for name in ("router", "single"):
    s = json.load(open("%s/%s.json" % (out, name)))["summary"]["all"]
    print("%-7s ok %d failed %d  TTFT p50 %.0f ms p99 %.0f ms  latency p50 %.0f ms p99 %.0f ms  %.1f tok/s" % (
        name, s["ok"], s["failures"], s["ttft_s"]["p50"] * 1e3, s["ttft_s"]["p99"] * 1e3,
        s["latency_s"]["p50"] * 1e3, s["latency_s"]["p99"] * 1e3, s["output_tokens_per_s"]))
print("sessions per node (directory):")
print(open(out + "/status.txt").read())
print("committed turns per node:")
print(open(out + "/turns_per_node.txt").read())
PY
