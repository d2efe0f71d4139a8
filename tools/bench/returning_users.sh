#!/usr/bin/env bash
# The headline benchmark of docs/BENCHMARKS.md: how long a returning user waits for the first
# token, by where the server found the conversation, on this machine, next to re-prefilling the
# whole conversation and next to llama.cpp's own C++ llama-server.
#
# Workload (`kvd bench serve`, shaped like vLLM's benchmarks/multi_turn and LMCache's multi-round
# QA): USERS users, each holding several conversations that grow turn by turn (up to 8 user
# messages), with exponential think time between turns; greedy, streaming. Runs:
#   kvd          one `kvd serve` (defaults); at EVENT_AT s it is restarted (SIGTERM, start)
#   reprefill    the same server driven statelessly: the whole conversation every turn
#   llama-server 4 slots, continuous batching, prompt cache and --cache-ram; restarted the same
#                way (its caches do not survive it)
#   migration    3 nodes and a router (tools/cluster/up.sh); at EVENT_AT s node n1 is drained:
#                its sessions move to the other two
#   failover     the same with --replicas 2 --replication sync; at EVENT_AT s n2 gets SIGKILL
#   capacity     USER_STEPS users for CAPACITY_S s each: one node, the router to 3, llama-server
#                (CAPACITY_SERVERS picks among kvd, llama, router); the most users that keep p95
#                TTFT under 2 s
# Each run's table and JSON land in OUT; summary.md and returning_users.png sum them up.
#
#   tools/bench/build_llama_server.sh          # once: llama-server from the pinned sources
#   tools/bench/returning_users.sh [out_dir]
#   USERS=16 DURATION=120 LLAMA_SERVER=/tmp/llama.cpp-server/bin/llama-server \
#     tools/bench/returning_users.sh /tmp/ru
#   RUNS="kvd llama-server" tools/bench/returning_users.sh /tmp/ru   # a subset of the runs
#   KVD_FLAGS="--policy kv-direct" RUNS=kvd tools/bench/returning_users.sh /tmp/ru-kvdirect
# All servers share this machine's cores: 3 nodes on 2 cores have no more compute than one.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${1:-/tmp/kvd-returning-users}"
KVD="${KVD:-bazel-bin/tools/kvd/kvd}"
LLAMA_SERVER="${LLAMA_SERVER:-/tmp/llama.cpp-server/bin/llama-server}"
USERS="${USERS:-16}"
DURATION="${DURATION:-120}"
EVENT_AT="${EVENT_AT:-60}"
THINK="${THINK:-3}"
MAX_TOKENS="${MAX_TOKENS:-32}"
USER_STEPS="${USER_STEPS:-4 8 12 16 24 32}"
CAPACITY_SERVERS="${CAPACITY_SERVERS:-kvd llama router}"  # which servers the capacity run steps
CAPACITY_S="${CAPACITY_S:-60}"
RUNS="${RUNS:-kvd reprefill llama-server migration failover capacity}"
MODEL_FILE="${MODEL_FILE:-$HOME/.cache/kvd/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
PORT="${PORT:-18500}"
THREADS="$(nproc)"
PY="${PY:-$HOME/.cache/kvd/pyenv/bin/python}"
[[ -x "$PY" ]] || PY=python3
mkdir -p "$OUT"
[[ -x "$KVD" ]] || bazel build -c opt //tools/kvd
{
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "machine: $(nproc) vCPU, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)," \
    "family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | xargs)," \
    "$(free -g | awk '/Mem:/{print $2}') GiB"
  echo "kvd: $(git rev-parse --short HEAD); llama-server: $LLAMA_SERVER"
  echo "workload: $USERS users, ${DURATION} s, think ${THINK} s, max_tokens $MAX_TOKENS," \
    "event at ${EVENT_AT} s"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT/machine.txt"

PIDFILE="$OUT/server.pid"
cleanup() {
  [[ -s "$PIDFILE" ]] && kill -TERM "$(cat "$PIDFILE")" 2> /dev/null
  [[ -f "$OUT/cluster/pids" ]] && tools/cluster/down.sh --dir "$OUT/cluster" > /dev/null 2>&1
  true
}
trap cleanup EXIT

bench() {  # bench NAME URL [bench serve flags...]
  local name="$1" url="$2"
  shift 2
  echo "== $name" | tee -a "$OUT/progress.txt"
  "$KVD" bench serve --url "$url" --sessions "$USERS" --duration "$DURATION" \
    --think-time "$THINK" --new-fraction 0.2 --max-turns 8 --max-tokens "$MAX_TOKENS" \
    --temperature 0 --seed 1 --stream --drain 120 --json "$OUT/$name.json" "$@" \
    > "$OUT/$name.md" 2> "$OUT/$name.err"
  cat "$OUT/$name.md"
}

# A server the event script can restart on the same port: its command line in OUT/NAME.cmd.
start_server() {  # start_server NAME PORT COMMAND...
  local name="$1" port="$2"
  shift 2
  printf '%q ' "$@" > "$OUT/$name.cmd"
  "$@" >> "$OUT/$name.log" 2>&1 &
  echo $! > "$PIDFILE"
  wait_ready "$port"
}
wait_ready() {
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$1/v1/models" > /dev/null && return 0
    sleep 0.2
  done
  echo "server on :$1 did not come up" >&2
  return 1
}
# The event of a single-server run: SIGTERM, wait until gone, start it again, wait until ready.
restart_script() {  # restart_script NAME PORT
  cat > "$OUT/restart-$1.sh" <<EOF
pid=\$(cat "$PIDFILE"); kill -TERM \$pid
while kill -0 \$pid 2> /dev/null && ! grep -q '^State:.*Z' /proc/\$pid/status; do sleep 0.1; done
$(cat "$OUT/$1.cmd") >> "$OUT/$1.log" 2>&1 &
echo \$! > "$PIDFILE"
for i in \$(seq 1 600); do curl -sf http://127.0.0.1:$2/v1/models > /dev/null && exit 0; sleep 0.2; done
exit 1
EOF
  echo "sh $OUT/restart-$1.sh"
}
stop_server() {
  kill -TERM "$(cat "$PIDFILE")" 2> /dev/null || true
  while kill -0 "$(cat "$PIDFILE")" 2> /dev/null; do sleep 0.2; done
  : > "$PIDFILE"
}

kvd_serve() {  # kvd_serve NAME PORT: one node with the defaults a user gets (plus KVD_FLAGS)
  rm -rf "$OUT/$1-data"
  # shellcheck disable=SC2086  # KVD_FLAGS is a list of flags
  start_server "$1" "$2" "$KVD" serve --model smollm2 --http-port "$2" --grpc-port -1 \
    --data-dir "$OUT/$1-data" ${KVD_FLAGS:-}
}
llama_serve() {  # llama_serve NAME PORT
  start_server "$1" "$2" "$LLAMA_SERVER" -m "$MODEL_FILE" --host 127.0.0.1 --port "$2" \
    -t "$THREADS" -np 4 -c 16384 --cache-ram 1024 --no-webui
}

cluster_up() {  # cluster_up NAME [kvd serve flags...]
  local name="$1"
  shift
  rm -rf "$OUT/cluster"
  KVD="$KVD" tools/cluster/up.sh --dir "$OUT/cluster" --nodes 3 --port "$PORT" --lease-ttl 3 \
    -- --threads "$THREADS" "$@" > "$OUT/$name-up.txt"
}
cluster_down() {
  tools/cluster/down.sh --dir "$OUT/cluster" --purge > /dev/null 2>&1 || true
}

for run in $RUNS; do
  case "$run" in
    kvd)
      kvd_serve kvd "$PORT"
      bench kvd "http://127.0.0.1:$PORT" --event-at "$EVENT_AT" --event-name restart \
        --event-cmd "$(restart_script kvd "$PORT")"
      stop_server ;;
    reprefill)
      kvd_serve reprefill "$PORT"
      bench reprefill "http://127.0.0.1:$PORT" --stateless
      stop_server ;;
    llama-server)
      [[ -x "$LLAMA_SERVER" ]] || { echo "no $LLAMA_SERVER: tools/bench/build_llama_server.sh" >&2; continue; }
      llama_serve llama-server "$PORT"
      bench llama-server "http://127.0.0.1:$PORT" --stateless --event-at "$EVENT_AT" \
        --event-name restart --event-cmd "$(restart_script llama-server "$PORT")"
      stop_server ;;
    migration)
      cluster_up migration
      bench migration "http://127.0.0.1:$PORT" --event-at "$EVENT_AT" --event-name migration \
        --event-cmd "$KVD cluster drain n1 --etcd $(cat "$OUT/cluster/etcd-endpoint")"
      cluster_down ;;
    failover)
      cluster_up failover --replicas 2 --replication sync
      etcd="$(cat "$OUT/cluster/etcd-endpoint")"
      victim="$(awk '$2 == "n2" {print $1}' "$OUT/cluster/pids")"
      # SIGKILL, then wait until n2's lease expired and no session is owned by it (failover done).
      cat > "$OUT/failover.sh" <<EOF
kill -KILL $victim
for i in \$(seq 1 300); do
  "$KVD" cluster status --etcd $etcd | grep -q '^n2 ' || exit 0  # neither live nor owning
  sleep 0.2
done
exit 1
EOF
      bench failover "http://127.0.0.1:$PORT" --event-at "$EVENT_AT" --event-name failover \
        --event-cmd "sh $OUT/failover.sh"
      cluster_down ;;
    capacity)
      saved="$DURATION"
      DURATION="$CAPACITY_S"
      for u in $USER_STEPS; do
        if [[ " $CAPACITY_SERVERS " == *" kvd "* ]]; then
          kvd_serve "cap-kvd-$u" "$PORT"
          USERS="$u" bench "cap-kvd-$u" "http://127.0.0.1:$PORT"
          stop_server
        fi
        if [[ -x "$LLAMA_SERVER" && " $CAPACITY_SERVERS " == *" llama "* ]]; then
          llama_serve "cap-llama-$u" "$PORT"
          USERS="$u" bench "cap-llama-$u" "http://127.0.0.1:$PORT" --stateless
          stop_server
        fi
        if [[ " $CAPACITY_SERVERS " == *" router "* ]]; then
          cluster_up "cap-router-$u"
          USERS="$u" bench "cap-router-$u" "http://127.0.0.1:$PORT"
          cluster_down
        fi
      done
      DURATION="$saved" ;;
    *) echo "unknown run $run" >&2; exit 2 ;;
  esac
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/machine.txt"
"$PY" tools/bench/returning_users_report.py "$OUT" | tee "$OUT/summary.md"
