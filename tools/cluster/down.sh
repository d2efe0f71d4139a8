#!/usr/bin/env bash
# Stops the cluster tools/cluster/up.sh started in --dir (default ./kvd-cluster): the router,
# then the nodes (SIGTERM: each leaves the cluster and flushes its sessions), then etcd. Data
# stays in the directory; --purge deletes it.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DIR="$ROOT/kvd-cluster"
PURGE=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dir) DIR="$2"; shift 2 ;;
    --purge) PURGE=1; shift ;;
    -h|--help) echo "usage: tools/cluster/down.sh [--dir DIR] [--purge]"; exit 0 ;;
    *) echo "down.sh: unknown flag $1" >&2; exit 2 ;;
  esac
done
[[ -f "$DIR/pids" ]] || { echo "down.sh: no cluster in $DIR (no pids file)" >&2; exit 1; }
stop() {  # stop NAME: SIGTERM, then SIGKILL after 20 s
  local pid
  while read -r pid name; do
    [[ "$name" == "$1" ]] || continue
    kill -TERM "$pid" 2> /dev/null || continue
    for _ in $(seq 1 100); do kill -0 "$pid" 2> /dev/null || break; sleep 0.2; done
    kill -KILL "$pid" 2> /dev/null || true
  done < "$DIR/pids"
}
stop router
for n in $(awk '$2 ~ /^n[0-9]+$/ {print $2}' "$DIR/pids"); do stop "$n" & done
wait
stop etcd
rm -f "$DIR/pids"
if [[ -f "$DIR/etcd-endpoint" && -f "$HOME/.config/kvd/cluster-etcd" ]] &&
   [[ "$(head -n 1 "$HOME/.config/kvd/cluster-etcd")" == "$(cat "$DIR/etcd-endpoint")" ]]; then
  rm -f "$HOME/.config/kvd/cluster-etcd"
fi
[[ "$PURGE" == 1 ]] && rm -rf "$DIR"
echo "down.sh: cluster in $DIR stopped"
