#!/usr/bin/env bash
# Builds the CUDA device tests and benchmarks HERE (no GPU needed) as
# self-contained x86-64 executables for sm_90a, for carrying to the lent GPU
# machine, which has nvcc but neither Bazel nor Debian's Abseil/GoogleTest.
# Also cuts dequant_fixture.bin (real GGUF tensors, ~4 MB) from the cached
# models for dequant_test (tools/gpu/make_dequant_fixture.py).
#
#   tools/gpu/build_device_binaries.sh            # -> tools/gpu/bin/ (git-ignored)
#   tools/gpu/build_device_binaries.sh /some/dir  # -> elsewhere
#
# The executables (and the fixture) are shipped as one gzip'd tar,
# bin/device_bins.tar.gz (~28 MB): loose, they exceed the device tool's 64 MiB
# carry limit (each one links the whole kernel library and its own Abseil and
# GoogleTest). device_check.sh unpacks it on the device machine; to inspect
# them here: mkdir /tmp/b && tar -C /tmp/b -xzf tools/gpu/bin/device_bins.tar.gz
#
# Then, with the device tool: run(command="tools/gpu/device_check.sh",
# carry=["tools/gpu/bin"], timeout_s=570).
#
# cuda_model_test (the CUDA model vs the CPU engine), tp_cuda_model_test
# (tensor parallelism simulated on one GPU; the NCCL all-reduce is not linked)
# cuda_backend_model_test (the engine's backend interface on the GPU),
# tp_cuda_backend_model_test (the tensor-parallel backend the engine runs on)
# and cuda_engine_test (the session engine itself on the GPU) are
# compiled by Bazel and relinked statically here (below), so this script
# needs Bazel too.
#
# Linking: CUDA runtime static (libcudart_static.a; it dlopens the driver's
# libcuda.so at run time), Abseil and GoogleTest static, libstdc++ and libgcc
# static. Only glibc (libc, libm, libdl, librt, libpthread) stays dynamic; the
# script fails if any other shared library, or a glibc symbol newer than
# GLIBC_MAX below, is needed.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
DEST="${1:-$ROOT/tools/gpu/bin}"
CUDA="${CUDA_ROOT:-/usr/local/cuda}"
NVCC="$CUDA/bin/nvcc"
CXX="${CXX:-g++}"
# The device image runs Ubuntu 24.04's glibc 2.39 (python 3.12.3 there);
# Debian 12 here has 2.36, so anything built here qualifies. Kept as a check.
GLIBC_MAX="2.36"
OBJ="$(mktemp -d)"
trap 'rm -rf "$OBJ"' EXIT
# Executables are staged here, checked, then bundled into $DEST.
OUT_DIR="$OBJ/bin"
mkdir -p "$OUT_DIR" "$DEST"
cd "$ROOT"

# Same device flags as tools/build/defs.bzl's kvd_cuda_library.
NVCC_FLAGS=(-std=c++17 -O3 -I. -gencode arch=compute_90a,code=sm_90a
            -gencode arch=compute_90,code=compute_90)
CXX_FLAGS=(-std=c++17 -O2 -I. -I"$CUDA/include" -Wall -Wextra -Werror
           -Wno-unused-parameter -Wno-sign-compare
           -Wno-missing-field-initializers)

CU_SRCS=(kernels/cuda/gemm.cu kernels/cuda/gemm_mma.cu kernels/cuda/elementwise.cu
         kernels/cuda/attention.cu kernels/cuda/bandwidth_probe.cu
         kernels/cuda/bf16_convert.cu kernels/cuda/dequant.cu
         kernels/cuda/kv_recompute.cu kernels/cuda/paged_attention.cu
         kernels/cuda/model_ops.cu
         kernels/cuda/internal/bench_kernels.cu)
pids=()
for src in "${CU_SRCS[@]}"; do
  "$NVCC" "${NVCC_FLAGS[@]}" -c "$src" -o "$OBJ/$(basename "$src").o" &
  pids+=($!)
done
# The CPU dequantizer is dequant_test's reference; built as Bazel builds it
# (kernels/quant/BUILD: -ffp-contract=off).
for src in kernels/quant/dequant.cc kernels/quant/ggml_type.cc; do
  "$CXX" "${CXX_FLAGS[@]}" -ffp-contract=off -c "$src" \
    -o "$OBJ/quant_$(basename "$src").o" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
CU_OBJS=("$OBJ"/*.cu.o)

# The mma GEMM's bit-identity with the WMMA one rests on both compiling to the
# same tensor-core instruction (gemm_mma.cu's file comment); check the SASS
# where a disassembler is at hand (this toolkit may not ship cuobjdump; set
# CUOBJDUMP to one). gemm_mma_test checks the bits themselves on the device.
CUOBJDUMP="${CUOBJDUMP:-$(command -v cuobjdump || echo "$CUDA/bin/cuobjdump")}"
if [[ -x "$CUOBJDUMP" ]]; then
  for o in gemm.cu.o gemm_mma.cu.o; do
    forms=$("$CUOBJDUMP" -sass "$OBJ/$o" | grep -oE 'HG?MMA[.A-Z0-9]*' | sort -u | tr '\n' ' ')
    if [[ "$forms" != "HMMA.16816.F32.BF16 " ]]; then
      echo "$o: expected only HMMA.16816.F32.BF16 tensor-core instructions, found: ${forms:-none}" >&2
      exit 1
    fi
  done
  echo "SASS: gemm.cu and gemm_mma.cu both use only HMMA.16816.F32.BF16"
else
  echo "note: no cuobjdump (set CUOBJDUMP): SASS instruction check skipped" >&2
fi
QUANT_OBJS=("$OBJ"/quant_*.o)

# Every Abseil archive inside one --start-group: the linker takes only the
# members that are referenced, and the group resolves their order.
STATIC_LIBS=(/usr/lib/x86_64-linux-gnu/libabsl_*.a)
GTEST_LIBS=(/usr/lib/x86_64-linux-gnu/libgtest_main.a
            /usr/lib/x86_64-linux-gnu/libgtest.a)

link() {  # link NAME CC_SOURCE [extra static libs...]
  local name="$1" src="$2"
  shift 2
  "$CXX" "${CXX_FLAGS[@]}" -c "$src" -o "$OBJ/$name.o"
  "$CXX" -o "$OUT_DIR/$name" "$OBJ/$name.o" "${CU_OBJS[@]}" \
    -Wl,--start-group "$@" "${STATIC_LIBS[@]}" -Wl,--end-group \
    "$CUDA/lib64/libcudart_static.a" \
    -static-libstdc++ -static-libgcc -lpthread -ldl -lrt -lm
  strip "$OUT_DIR/$name"
}

for t in gemm_test gemm_mma_test elementwise_test attention_test argument_checks_test \
         kv_recompute_test paged_attention_test paged_recompute_test; do
  link "$t" "kernels/cuda/$t.cc" "${GTEST_LIBS[@]}" &
done
# bf16_convert_test's reference is the inline kernels/cpu/elementwise.h
# FloatToBf16: header only, nothing from kernels/cpu to link.
link bf16_convert_test kernels/cuda/bf16_convert_test.cc "${GTEST_LIBS[@]}" &
link dequant_test kernels/cuda/dequant_test.cc "${QUANT_OBJS[@]}" \
  "${GTEST_LIBS[@]}" &
link kernels_benchmark kernels/cuda/kernels_benchmark.cc &
link model_benchmark kernels/cuda/model_benchmark.cc &
wait_all_ok=0
for j in $(jobs -p); do wait "$j" || wait_all_ok=1; done
[[ $wait_all_ok -eq 0 ]] || { echo "link failed" >&2; exit 1; }

# Tests that need the CPU engine (ops/model, kernels/cpu, ...) as their
# reference: Bazel compiles them (linkstatic = 1, so its link line names
# objects, not shared libraries), and they are relinked here from the objects
# in Bazel's -2.params file with the static Abseil/GoogleTest/CUDA runtime in
# place of its -l flags. Bazel's link uses gold (--start-lib groups).
BAZEL_TESTS=(//ops/backend:cuda_model_test //ops/backend:tp_cuda_model_test
             //ops/backend:cuda_backend_model_test
             //ops/backend:cuda_backend_conformance_test
             //ops/backend:tp_cuda_backend_model_test
             //ops/backend:all_reduce_test
             //services/engine:cuda_engine_test)
# The engine's session store (cuda_engine_test) brings RocksDB, protobuf and
# RocksDB's compression libraries; Debian ships them as static archives too.
# The linker takes only what a test references.
STORE_LIBS=()
for lib in rocksdb protobuf gflags snappy lz4 zstd bz2 z; do
  STORE_LIBS+=("/usr/lib/x86_64-linux-gnu/lib$lib.a")
done
bazel build "${BAZEL_TESTS[@]}"
for target in "${BAZEL_TESTS[@]}"; do
  pkg="${target#//}"; pkg="${pkg%%:*}"; name="${target##*:}"
  params="bazel-bin/$pkg/$name-2.params"
  mapfile -t inputs < <(grep -E '^(bazel-out/.*\.o|-Wl,(--start-lib|--end-lib|-whole-archive|-no-whole-archive))$' "$params")
  [[ ${#inputs[@]} -gt 0 ]] || { echo "no objects in $params" >&2; exit 1; }
  "$CXX" -fuse-ld=gold -o "$OUT_DIR/$name" "${inputs[@]}" \
    -Wl,--start-group "${STATIC_LIBS[@]}" "${STORE_LIBS[@]}" \
    /usr/lib/x86_64-linux-gnu/libgmock.a "${GTEST_LIBS[@]}" -Wl,--end-group \
    "$CUDA/lib64/libcudart_static.a" \
    -static-libstdc++ -static-libgcc -lpthread -ldl -lrt -lm
  strip "$OUT_DIR/$name"
done

# Real tensors for dequant_test (the model files are too big to carry).
MODELS="${KVD_MODEL_DIR:-$HOME/.cache/kvd/models}"
if python3 -c "import gguf" 2>/dev/null &&
   [[ -f "$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf" &&
      -f "$MODELS/gemma-3-270m-q4_k_m.gguf" ]]; then
  python3 tools/gpu/make_dequant_fixture.py "$OUT_DIR/dequant_fixture.bin" \
    "$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf" \
    "$MODELS/gemma-3-270m-q4_k_m.gguf" >/dev/null
else
  echo "warning: no models in $MODELS or no python gguf: dequant_test's" \
       "real-tensor case will skip (tools/fetch_models.sh all)" >&2
  rm -f "$OUT_DIR/dequant_fixture.bin"
fi

# Self-containment checks.
status=0
for b in "$OUT_DIR"/*; do
  [[ "$b" == *.bin ]] && continue  # data, not an executable
  needed=$(readelf -d "$b" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p')
  for lib in $needed; do
    case "$lib" in
      libc.so.6|libm.so.6|libdl.so.2|librt.so.1|libpthread.so.0|ld-linux-x86-64.so.2) ;;
      *) echo "$b needs non-glibc shared library $lib" >&2; status=1 ;;
    esac
  done
  newest=$(objdump -T "$b" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' |
           sort -V | tail -1)
  if [[ "$(printf '%s\n%s\n' "$newest" "$GLIBC_MAX" | sort -V | tail -1)" != "$GLIBC_MAX" ]]; then
    echo "$b needs GLIBC_$newest > $GLIBC_MAX" >&2
    status=1
  fi
  if ! grep -q "sm_90a" <(strings "$b" | grep -m1 -o 'sm_90a' || true); then
    echo "$b: no sm_90a code found" >&2
    status=1
  fi
done
[[ $status -eq 0 ]] || exit 1
ls -la "$OUT_DIR"
# Loose copies from before the bundle existed (only the names built here).
for b in "$OUT_DIR"/*; do rm -f "$DEST/$(basename "$b")"; done
tar -C "$OUT_DIR" -czf "$DEST/device_bins.tar.gz" .
bytes=$(du -cb "$DEST" | tail -1 | cut -f1)
if (( bytes > 60 * 1024 * 1024 )); then
  echo "$DEST is $bytes bytes: over the 60 MiB kept under the 64 MiB carry limit" >&2
  exit 1
fi
ls -la "$DEST"
echo "built into $DEST/device_bins.tar.gz, $bytes bytes (carry it: tools/gpu/bin)"
