#!/usr/bin/env bash
# Runs kvd's CPU engine and llama.cpp's llama-bench on the same machine, same model weights and
# same shapes (pp512 prefill, tg128 decode), one after the other, and prints both tables.
# Results go in docs/BENCHMARKS.md together with the command, date and machine.
#
#   LLAMA_BENCH=/path/to/llama-bench tools/bench/compare_llama_cpp.sh [out_dir]
#
# llama-bench is not part of kvd: build it from llama.cpp (e.g. the sources vendored in the
# llama-cpp-python sdist, see tools/reference/build_llama_cpp_exact.sh). Reference GGUFs with
# the weights kvd uses (SmolLM2 dequantized to F32, then BF16/F16) come from
# tools/reference/make_f32_gguf.py and llama-quantize.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${1:-/tmp/kvd-bench}"
mkdir -p "$OUT"
MODELS="${KVD_MODEL_DIR:-$HOME/.cache/kvd/models}"
REF="$MODELS/ref"
LLAMA_BENCH="${LLAMA_BENCH:?set LLAMA_BENCH to a llama-bench binary}"
THREADS="${THREADS:-1,2}"
REPS="${REPS:-3}"

{
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "machine: $(nproc) vCPU, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)," \
    "family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | xargs)" \
    "model $(grep -m1 '^model\s' /proc/cpuinfo | cut -d: -f2 | xargs)," \
    "$(free -g | awk '/Mem:/{print $2}') GiB"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT/machine.txt"

bazel build -c opt //tools/kvd >/dev/null 2>&1
echo "== kvd bench"
bazel-bin/tools/kvd/kvd bench --model smollm2 --precision fp32,bf16 --threads "$THREADS" \
  --batch 1,8,32 --prompt-tokens 512 --gen-tokens 128 --repetitions "$REPS" | tee "$OUT/kvd.md"

echo "== llama-bench"
args=()
for f in SmolLM2-135M-Instruct.Q4_1.f32.gguf SmolLM2-135M-Instruct.Q4_1.bf16.gguf \
         SmolLM2-135M-Instruct.Q4_1.f16.gguf; do
  [[ -f "$REF/$f" ]] && args+=(-m "$REF/$f")
done
args+=(-m "$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf")
LD_LIBRARY_PATH="$(dirname "$LLAMA_BENCH")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  "$LLAMA_BENCH" "${args[@]}" -p 512 -n 128 -t "$THREADS" -r "$REPS" -o md | tee "$OUT/llama.md"
