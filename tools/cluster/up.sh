#!/usr/bin/env bash
# A kvd cluster on one machine (docs/CLUSTER.md): etcd, N nodes (`kvd serve --cluster`) and a
# router, all data and logs under one directory. Ends by printing the router's URL and etcd's
# endpoint, and records the endpoint so `kvd cluster status` finds this cluster with no flags.
# Stop it with tools/cluster/down.sh (same --dir).
#
#   tools/cluster/up.sh                       # 3 nodes of smollm2, router on :8000
#   tools/cluster/up.sh --nodes 2 --model gemma3 --port 9000 --dir /tmp/c
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DIR="$ROOT/kvd-cluster"
NODES=3
MODEL="smollm2"
PORT=8000
TTL=15
TLS=1
KVD="${KVD:-}"
EXTRA=()
usage() {
  cat <<USAGE
usage: tools/cluster/up.sh [--dir DIR] [--nodes N] [--model NAME] [--port PORT] [--lease-ttl S]
                           [-- EXTRA kvd serve FLAGS]
  --dir DIR       data, logs and pids of the whole cluster (default: ./kvd-cluster)
  --nodes N       kvd serve nodes (default 3)
  --model NAME    model every node serves (default smollm2; see tools/fetch_models.sh)
  --port PORT     the router's HTTP port (default 8000)
  --lease-ttl S   the nodes' membership lease (default 15 s)
  --no-tls        plain HTTP between router and nodes (default: mutual TLS, a cluster CA and a
                  certificate per node and router made by tools/cluster/make_certs.sh in DIR/certs)
  \$KVD           the kvd binary (default: bazel-bin/tools/kvd/kvd, built if missing)
USAGE
}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dir) DIR="$2"; shift 2 ;;
    --nodes) NODES="$2"; shift 2 ;;
    --model) MODEL="$2"; shift 2 ;;
    --port) PORT="$2"; shift 2 ;;
    --lease-ttl) TTL="$2"; shift 2 ;;
    --no-tls) TLS=0; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "up.sh: unknown flag $1" >&2; usage >&2; exit 2 ;;
  esac
done
command -v etcd > /dev/null || { echo "up.sh: etcd is not installed; run tools/setup.sh --test" >&2; exit 1; }
if [[ -z "$KVD" ]]; then
  KVD="$ROOT/bazel-bin/tools/kvd/kvd"
  if [[ ! -x "$KVD" ]]; then
    echo "up.sh: building kvd (bazel build //tools/kvd)..." >&2
    (cd "$ROOT" && bazel build //tools/kvd) >&2
  fi
fi
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
if [[ -s "$DIR/pids" ]]; then
  echo "up.sh: $DIR already has a cluster (pids); stop it first: tools/cluster/down.sh --dir $DIR" >&2
  exit 1
fi
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_for() {  # wait_for SECONDS WHAT CMD...: polls CMD until it succeeds
  local limit="$1" what="$2"; shift 2
  for _ in $(seq 1 $((limit * 5))); do
    "$@" > /dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "up.sh: $what did not come up in ${limit}s; logs in $DIR" >&2
  exit 1
}

[[ -s "$DIR/router-token" ]] || (umask 077; head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$DIR/router-token")
TOKEN="$(cat "$DIR/router-token")"

# Mutual TLS: a certificate per node and for the router, each naming it (node:nI, router:r1).
tls_flags() {  # tls_flags node|router ID: issues its certificate once; its flags in TLS_FLAGS
  TLS_FLAGS=()
  [[ "$TLS" == 1 ]] || return 0
  [[ -s "$DIR/certs/$1-$2.pem" ]] || "$ROOT/tools/cluster/make_certs.sh" "$DIR/certs" "--$1" "$2" > /dev/null
  TLS_FLAGS=(--tls-cert "$DIR/certs/$1-$2.pem" --tls-key "$DIR/certs/$1-$2.key" --ca-cert "$DIR/certs/ca.pem")
}

ETCD_PORT="$(free_port)"
PEER_PORT="$(free_port)"
ETCD="127.0.0.1:$ETCD_PORT"
# With TLS, etcd too: it serves its clients over TLS, requires certificates of the cluster CA
# (--client-cert-auth) and, once `kvd cluster etcd-auth` has run, lets each node and the router
# (an etcd user named by its certificate) use only /kvd/. `kvd cluster` acts as etcd's root.
ETCD_SERVER_TLS=()
ROOT_TLS=()
if [[ "$TLS" == 1 ]]; then
  for c in "--etcd e1" "--client root"; do
    n="${c#--}"; n="${n/ /-}"
    [[ -s "$DIR/certs/$n.pem" ]] || "$ROOT/tools/cluster/make_certs.sh" "$DIR/certs" $c > /dev/null
  done
  ETCD_SERVER_TLS=(--cert-file "$DIR/certs/etcd-e1.pem" --key-file "$DIR/certs/etcd-e1.key"
                   --trusted-ca-file "$DIR/certs/ca.pem" --client-cert-auth)
  ROOT_TLS=(--ca-cert "$DIR/certs/ca.pem" --tls-cert "$DIR/certs/client-root.pem"
            --tls-key "$DIR/certs/client-root.key")
  SCHEME=https
else
  SCHEME=http
fi
etcd --name kvd --data-dir "$DIR/etcd" "${ETCD_SERVER_TLS[@]}" \
  --listen-client-urls "$SCHEME://$ETCD" --advertise-client-urls "$SCHEME://$ETCD" \
  --listen-peer-urls "http://127.0.0.1:$PEER_PORT" \
  --initial-advertise-peer-urls "http://127.0.0.1:$PEER_PORT" \
  --initial-cluster "kvd=http://127.0.0.1:$PEER_PORT" > "$DIR/etcd.log" 2>&1 &
echo "$! etcd" >> "$DIR/pids"
[[ "$TLS" == 1 ]] && ETCD="https://$ETCD"
wait_for 30 "etcd" "$KVD" cluster status --etcd "$ETCD" "${ROOT_TLS[@]}"
if [[ "$TLS" == 1 ]]; then
  USERS=(router:r1)
  for i in $(seq 1 "$NODES"); do USERS+=("node:n$i"); done
  "$KVD" cluster etcd-auth --etcd "$ETCD" "${ROOT_TLS[@]}" "${USERS[@]}" > /dev/null
fi

for i in $(seq 1 "$NODES"); do
  tls_flags node "n$i"
  KVD_ROUTER_TOKEN="$TOKEN" "$KVD" serve --cluster "$ETCD" --node-id "n$i" --lease-ttl "$TTL" \
    --model "$MODEL" --http-port 0 --grpc-port 0 --data-dir "$DIR/n$i" "${TLS_FLAGS[@]}" "${EXTRA[@]}" \
    > "$DIR/n$i.log" 2>&1 &
  echo "$! n$i" >> "$DIR/pids"
done
nodes_live() { [[ "$("$KVD" cluster status --etcd "$ETCD" "${ROOT_TLS[@]}" | grep -c ' live ')" -ge "$NODES" ]]; }
echo "up.sh: starting etcd and $NODES nodes of $MODEL (loading the model takes a while)..." >&2
wait_for 300 "$NODES nodes" nodes_live

tls_flags router r1
KVD_ROUTER_TOKEN="$TOKEN" "$KVD" router --etcd "$ETCD" --port "$PORT" --grpc-port 0 "${TLS_FLAGS[@]}" \
  > "$DIR/router.log" 2>&1 &
echo "$! router" >> "$DIR/pids"
wait_for 30 "the router" curl -sf "http://127.0.0.1:$PORT/readyz"

mkdir -p "$HOME/.config/kvd"
# The endpoint, and with TLS the files `kvd cluster` presents as etcd's root (cluster_endpoint.h).
{
  echo "$ETCD"
  if [[ "$TLS" == 1 ]]; then
    printf '%s\n' "$DIR/certs/ca.pem" "$DIR/certs/client-root.pem" "$DIR/certs/client-root.key"
  fi
} > "$HOME/.config/kvd/cluster-etcd"
echo "$ETCD" > "$DIR/etcd-endpoint"
"$KVD" cluster status --etcd "$ETCD" "${ROOT_TLS[@]}" >&2
echo "router: http://127.0.0.1:$PORT/v1"
echo "router gRPC: $(grep -o 'gRPC *127.0.0.1:[0-9]*' "$DIR/router.log" | awk '{print $2}')"
echo "etcd: $ETCD"
