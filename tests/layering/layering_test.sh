#!/usr/bin/env bash
# Fails on a dependency that breaks kvd's layering (docs/ARCHITECTURE.md "Layers", the table in
# the team's STYLE.md). Input: the real dependency graph of every target in the workspace, as
# Bazel computed it (//tests/layering:graph, edges; :kinds, each node's kind), so macros,
# select() branches, data and file dependencies all count; implicit (toolchain) dependencies
# and visibility (package groups) do not.
#
# Each package belongs to a class; an edge from package P to another package Q is allowed when
# Q's class is in P's "may use" list below. Edges inside a package are always allowed.
#
#   class      packages                                     may use
#   base       base/ proto/ third_party/ tools/build         base
#   kernels    kernels/                                     base kernels
#   ops        ops/                                         base kernels ops
#   storage    storage/                                     base storage
#   planner    services/planner                             base kernels ops storage planner
#   engine     services/engine                              base kernels ops storage planner engine
#   transport  services/transport services/collective       base transport
#   cluster    services/cluster (etcd client, membership)   base cluster
#   server     services/node services/router services/migration  everything but the leaves
#   leaf       tools/ tests/                                everything
#
# One exception: a *_test rule may read a source file under //tests/golden/ (golden data:
# expected values, not code; the BUILD files there say which packages may).
#
# A package no class covers fails the test: add it to the table (and to the root BUILD's
# package groups). Also checks that every package on disk is in scope.bzl, when the source
# tree is visible from the test (it is under local sandboxing), so a new package nothing
# depends on is not silently left out.
#
#   layering_test.sh GRAPH KINDS SCOPE_BZL
set -uo pipefail

graph="$1"
kinds="$2"
scope_bzl="$3"

failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

[[ -s "$graph" ]] || { echo "FAIL: empty graph $graph"; exit 1; }
[[ -s "$kinds" ]] || { echo "FAIL: empty kinds $kinds"; exit 1; }

# --- The graph ---------------------------------------------------------------------------------
# kinds lines: "cc_library rule //ops/model:model", "source file //ops/model:model.cc".
# graph lines: "  \"//a:b\" -> \"//c:d\"" (and one line per node, which we skip).
report="$(
  awk '
    function pkg(label, p) {
      p = label
      sub(/^\/\//, "", p)
      sub(/:.*/, "", p)
      return p
    }
    function under(p, dir) { return p == dir || index(p, dir "/") == 1 }
    function class(p) {
      if (under(p, "base") || under(p, "proto") || under(p, "third_party") ||
          under(p, "tools/build") || p == "") return "base"
      if (under(p, "kernels")) return "kernels"
      if (under(p, "ops")) return "ops"
      if (under(p, "storage")) return "storage"
      if (under(p, "services/planner")) return "planner"
      if (under(p, "services/engine")) return "engine"
      if (under(p, "services/transport") || under(p, "services/collective")) return "transport"
      if (under(p, "services/cluster")) return "cluster"
      if (under(p, "services/node") || under(p, "services/router") ||
          under(p, "services/migration") || under(p, "services/worker")) return "server"
      if (under(p, "tools") || under(p, "tests")) return "leaf"
      return ""
    }
    BEGIN {
      layer["base"] = 0; layer["kernels"] = 1; layer["ops"] = 2; layer["storage"] = 2
      layer["planner"] = 3; layer["engine"] = 3; layer["transport"] = 3; layer["cluster"] = 3; layer["server"] = 4
      layer["leaf"] = "leaf"
      may["base"] = " base "
      may["kernels"] = " base kernels "
      may["ops"] = " base kernels ops "
      may["storage"] = " base storage "
      may["planner"] = " base kernels ops storage planner "
      may["engine"] = " base kernels ops storage planner engine "
      may["transport"] = " base transport "
      may["cluster"] = " base cluster "
      may["server"] = " base kernels ops storage planner engine transport cluster server "
      may["leaf"] = " base kernels ops storage planner engine transport cluster server leaf "
    }
    FNR == NR {  # kinds
      label = $NF
      $NF = ""
      sub(/ +$/, "")
      kind[label] = $0
      next
    }
    / -> / {
      from = $1; to = $3
      gsub(/"/, "", from); gsub(/"/, "", to)
      if (from !~ /^\/\// || to !~ /^\/\//) next   # external repositories
      edges++
      pf = pkg(from); pt = pkg(to)
      packages[pf] = 1; packages[pt] = 1
      if (pf == pt) next
      cf = class(pf); ct = class(pt)
      if (cf == "") { unknown[pf] = 1; next }
      if (ct == "") { unknown[pt] = 1; next }
      if (index(may[cf], " " ct " ") > 0) { cross++; next }
      if (kind[from] ~ /_test rule$/ && kind[to] == "source file" &&
          under(pt, "tests/golden")) { golden++; next }
      printf "VIOLATION %s (%s, layer %s) -> %s (%s, layer %s): %s may use only%s\n",
             from, cf, layer[cf], to, ct, layer[ct], cf, may[cf]
    }
    END {
      for (p in unknown)
        printf "UNKNOWN package %s has no layer: add it to the table in " \
               "tests/layering/layering_test.sh and to the root BUILD\n", p
      n = 0
      for (p in packages) n++
      printf "SUMMARY %d edges among %d targets in %d packages; %d cross-package edges " \
             "allowed, %d golden-data reads\n", edges, length(kind), n, cross, golden
    }
  ' "$kinds" "$graph"
)"

while IFS= read -r line; do
  case "$line" in
    VIOLATION*) fail "upward or sideways dependency: ${line#VIOLATION }" ;;
    UNKNOWN*) fail "${line#UNKNOWN }" ;;
    SUMMARY*) summary="${line#SUMMARY }" ;;
  esac
done <<<"$report"

# The graph must really be the whole workspace: every package of the layers (the query's roots;
# the leaves are not roots) has targets in it.
listed="$(grep -o '^    "[^"/][^"]*",$\|^    "",$' "$scope_bzl" | sed 's/^    "\(.*\)",$/\1/' |
  LC_ALL=C sort -u)"
while read -r p; do
  case "$p" in
    tools/build) ;;
    "" | tests/* | tools/*) continue ;;  # the root package has no rules; leaves are no roots
  esac
  grep -q "^  \"//$p:[^\"]*\"$" "$graph" || fail "no target of package $p in the graph: is :graph stale?"
done <<<"$listed"

# --- Every package on disk is in scope.bzl ----------------------------------------------------
real_scope="$(readlink -f "$scope_bzl" 2>/dev/null || true)"
root="${real_scope%/tests/layering/scope.bzl}"
if [[ -n "$real_scope" && "$root" != "$real_scope" && -f "$root/WORKSPACE" ]]; then
  on_disk="$(
    cd "$root" &&
      find . \( -name 'bazel-*' -o -name .git \) -prune -o \
        \( -name BUILD -o -name BUILD.bazel \) -type f -print |
      sed 's|^\./||; s|/\?BUILD\(\.bazel\)\?$||' |
      while read -r p; do
        # Skip nested repositories (local_repository) and this package.
        d="$p"
        nested=0
        while [[ -n "$d" && "$d" != . ]]; do
          [[ -f "$d/WORKSPACE" || -f "$d/WORKSPACE.bazel" ]] && nested=1
          [[ "$d" == */* ]] && d="${d%/*}" || d=""
        done
        ((nested)) || [[ "$p" == tests/layering ]] || echo "$p"
      done | LC_ALL=C sort -u
  )"
  missing="$(LC_ALL=C comm -23 <(echo "$on_disk") <(echo "$listed"))"
  if [[ -n "$missing" ]]; then
    fail "packages on disk missing from tests/layering/scope.bzl (run" \
      "tests/layering/update_scope.sh): $(tr '\n' ' ' <<<"$missing")"
  else
    echo "package inventory: $(wc -l <<<"$on_disk") packages on disk, all in scope.bzl"
  fi
else
  echo "NOTE: the source tree is not visible from the test; package inventory not checked"
fi

echo "${summary:-no summary}"
if ((failures)); then
  echo "$failures layering failure(s)"
  exit 1
fi
echo "layering: every dependency points down"
