#!/usr/bin/env bash
# Runs kvd's CPU engine and llama.cpp's llama-bench on the same machine, same model weights and
# same shapes (pp512 prefill, tg128 decode, decode at context depth), one after the other, and
# prints both tables plus each run's peak resident memory. Results go in docs/BENCHMARKS.md
# together with the command, date and machine.
#
#   LLAMA_BENCH=/path/to/llama-bench tools/bench/compare_llama_cpp.sh [out_dir]
#
# Environment: THREADS (default 1,2), REPS (default 3), DEPTHS (default 2048,8064: SmolLM2's
# context is 8192 tokens, and depth + 128 generated tokens must fit it).
#
# llama-bench is not part of kvd: build it from llama.cpp (e.g. the sources vendored in the
# llama-cpp-python sdist, see tools/reference/build_llama_cpp_exact.sh). Reference GGUFs with
# the weights kvd uses (SmolLM2 dequantized to F32, then BF16/F16) come from
# tools/reference/make_f32_gguf.py and llama-quantize. The Q4_1 file is the one users run;
# kvd's fp32 mode computes on it exactly (weights kept as stored), llama.cpp's Q4_1 path
# multiplies by 8-bit-quantized activations.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${1:-/tmp/kvd-bench}"
mkdir -p "$OUT"
MODELS="${KVD_MODEL_DIR:-$HOME/.cache/kvd/models}"
REF="$MODELS/ref"
LLAMA_BENCH="${LLAMA_BENCH:?set LLAMA_BENCH to a llama-bench binary}"
THREADS="${THREADS:-1,2}"
REPS="${REPS:-3}"
DEPTHS="${DEPTHS:-2048,8064}"
Q41="$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf"
export LD_LIBRARY_PATH="$(dirname "$LLAMA_BENCH")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

{
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "commit: $(git rev-parse --short HEAD)"
  echo "machine: $(nproc) vCPU, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)," \
    "family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | xargs)" \
    "model $(grep -m1 '^model\s' /proc/cpuinfo | cut -d: -f2 | xargs)," \
    "$(free -g | awk '/Mem:/{print $2}') GiB"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT/machine.txt"

bazel build -c opt //tools/kvd >/dev/null 2>&1
KVD=bazel-bin/tools/kvd/kvd

echo "== kvd bench (pp512, tg128, batch 1)"
"$KVD" bench --model smollm2 --precision fp32,bf16 --weights as-stored,converted \
  --threads "$THREADS" --batch 1 --prompt-tokens 512 --gen-tokens 128 \
  --repetitions "$REPS" | tee "$OUT/kvd.md"

echo "== kvd bench (tg128 at depth, fp32 as stored, batch 1)"
"$KVD" bench --model smollm2 --precision fp32 --weights as-stored --threads "$THREADS" \
  --batch 1 --prompt-tokens 16 --gen-tokens 128 --depth "0,$DEPTHS" \
  --repetitions "$REPS" | tee "$OUT/kvd_depth.md"

echo "== llama-bench (pp512, tg128)"
args=()
for f in SmolLM2-135M-Instruct.Q4_1.f32.gguf SmolLM2-135M-Instruct.Q4_1.bf16.gguf \
         SmolLM2-135M-Instruct.Q4_1.f16.gguf; do
  [[ -f "$REF/$f" ]] && args+=(-m "$REF/$f")
done
args+=(-m "$Q41")
"$LLAMA_BENCH" "${args[@]}" -p 512 -n 128 -t "$THREADS" -r "$REPS" -o md | tee "$OUT/llama.md"

echo "== llama-bench (tg128 at depth, Q4_1)"
"$LLAMA_BENCH" -m "$Q41" -p 0 -n 128 -d "0,$DEPTHS" -t "$THREADS" -r "$REPS" -o md \
  | tee "$OUT/llama_depth.md"

# Peak resident memory of one pp512 + tg128 run at 1 thread, each engine in its own process.
# kvd's figure is its own high-water mark (the "peak RSS" column; /usr/bin/time would also count
# the child process that measures the machine's ceilings), llama-bench's is /usr/bin/time's.
echo "== peak RSS, MiB (one pp512 + tg128 run, 1 thread, own process)" | tee "$OUT/memory.md"
echo "| engine | weights | peak RSS MiB |" | tee -a "$OUT/memory.md"
echo "|---|---|---|" | tee -a "$OUT/memory.md"
for p in fp32 bf16; do
  for w in as-stored converted; do
    mib=$("$KVD" bench --model smollm2 --precision "$p" --weights "$w" --threads 1 --batch 1 \
      --prompt-tokens 512 --gen-tokens 128 --repetitions 1 | awk -F'|' '/tg128/{print $8}' | xargs)
    echo "| kvd $p | Q4_1 file, $w | $mib |" | tee -a "$OUT/memory.md"
  done
done
for f in "$Q41" "$REF/SmolLM2-135M-Instruct.Q4_1.f32.gguf" \
         "$REF/SmolLM2-135M-Instruct.Q4_1.bf16.gguf"; do
  [[ -f "$f" ]] || continue
  kb=$(/usr/bin/time -f "%M" "$LLAMA_BENCH" -m "$f" -p 512 -n 128 -t 1 -r 1 2>&1 >/dev/null | tail -1)
  echo "| llama.cpp | $(basename "$f") | $((kb / 1024)) |" | tee -a "$OUT/memory.md"
done
