#!/usr/bin/env bash
# The one device check for the CUDA kernels, run on the lent GPU machine from
# the repository root, with binaries built HERE beforehand:
#
#   tools/gpu/build_device_binaries.sh          # on the CPU machine
#   device run: command="tools/gpu/device_check.sh", carry=["tools/gpu/bin"],
#               timeout_s=570
#
# Steps, each under its own timeout so the whole stays well under 10 minutes
# (worst case: tests 5 x 60 s, benchmark 150 s, ceilings 60 s = 8.5 min): environment,
# every test binary (correctness vs float64, poisoned outputs, bit-identity),
# the kernel benchmark, the PyTorch ceilings. Full logs go to $OUT (env.txt,
# tests.log, bench.log, ceilings.log, summary.txt); the short table is printed
# last. Exit status: 0 if every test passed, 1 otherwise.
#
# Options: QUICK=1 runs the benchmark's --quick mode (fewer shapes and reps).
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BIN="${BIN:-$ROOT/tools/gpu/bin}"
OUT="${OUT:-/tmp/kvd_device_check}"
mkdir -p "$OUT"
cd "$ROOT"

if [[ ! -x "$BIN/gemm_test" ]]; then
  echo "no binaries in $BIN: run tools/gpu/build_device_binaries.sh here and carry tools/gpu/bin" >&2
  exit 2
fi

{
  date -u +%Y-%m-%dT%H:%M:%SZ
  uname -a
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv 2>&1
  ldd "$BIN/gemm_test" 2>&1
} >"$OUT/env.txt" 2>&1
echo "== environment"; cat "$OUT/env.txt"

declare -A verdict
fails=0
: >"$OUT/tests.log"
for t in argument_checks_test bf16_convert_test elementwise_test attention_test gemm_test; do
  echo "== $t" | tee -a "$OUT/tests.log"
  start=$(date +%s)
  timeout 60 "$BIN/$t" --gtest_color=no >>"$OUT/tests.log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  if [[ $rc -eq 0 ]]; then verdict[$t]="PASS (${secs}s)"; else verdict[$t]="FAIL rc=$rc (${secs}s)"; fails=$((fails + 1)); fi
  echo "   ${verdict[$t]}"
done

echo "== benchmark"
bench_args=()
[[ "${QUICK:-0}" == 1 ]] && bench_args=(--quick)
timeout 150 "$BIN/kernels_benchmark" "${bench_args[@]}" >"$OUT/bench.log" 2>&1
echo "   kernels_benchmark rc=$?"

echo "== ceilings (PyTorch)"
PYTHONUNBUFFERED=1 timeout 60 python3 tools/gpu/ceilings.py >"$OUT/ceilings.log" 2>&1
echo "   ceilings rc=$?"

# Short table, last.
{
  echo "kvd CUDA device check, $(date -u +%Y-%m-%d), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
  echo
  echo "| test | result |"
  echo "|---|---|"
  for t in argument_checks_test bf16_convert_test elementwise_test attention_test gemm_test; do
    echo "| $t | ${verdict[$t]} |"
  done
  echo
  echo "| measurement | value | unit | note |"
  echo "|---|---|---|---|"
  cat "$OUT/ceilings.log" "$OUT/bench.log" 2>/dev/null | awk -F'\t' '$1 == "RESULT" {
      if ($2 ~ /_gbs$/ && $2 ~ /^gemm_/ && $2 !~ /_m(1|8|64)_gbs$/) next;
      printf "| %s | %s | %s | %s |\n", $2, $3, $4, $5 }'
  ceiling=$(awk -F'\t' '$2 == "bf16_matmul_ceiling" {print $3}' "$OUT/ceilings.log" 2>/dev/null)
  hbm=$(awk -F'\t' '$2 == "hbm_read" {print $3}' "$OUT/bench.log" 2>/dev/null)
  echo
  if [[ -n "$ceiling" ]]; then
    awk -F'\t' -v c="$ceiling" '$2 ~ /^gemm_.*_m4096_tflops$/ {
        printf "%s: %.1f%% of the measured bf16 matrix ceiling (%s TFLOP/s)\n", $2, 100 * $3 / c, c }' "$OUT/bench.log"
  fi
  if [[ -n "$hbm" ]]; then
    awk -F'\t' -v h="$hbm" '$2 ~ /^gemm_.*_m1_gbs$/ {
        printf "%s: %.1f%% of measured HBM read bandwidth (%s GB/s)\n", $2, 100 * $3 / h, h }' "$OUT/bench.log"
  fi
} >"$OUT/summary.txt"
echo
cat "$OUT/summary.txt"
exit $(( fails > 0 ? 1 : 0 ))
