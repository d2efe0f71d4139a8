#!/usr/bin/env bash
# Builds the llama.cpp libraries used as kvd's fp32 reference, and llama-bench.
#
# Stock llama.cpp computes GELU on the CPU by rounding its fp32 input to fp16
# and looking the result up in an fp16 table (GGML_GELU_FP16 in
# ggml/src/ggml-cpu/vec.h). On Gemma 3 that alone moves the logits by ~2e-4
# relative L2 away from exact arithmetic, while SmolLM2 (SiLU) stays at ~6e-7.
# For an fp32 reference we rebuild libggml-cpu with that one define commented
# out, and run llama-cpp-python against it through LLAMA_CPP_LIB_PATH. With it,
# Gemma 3's logits match a float64 numpy forward to ~2e-7-2e-5
# (tools/reference/check_f32_reference.py).
#
# Needs: pip install llama-cpp-python==0.3.36 (built with
#   CMAKE_ARGS="-DGGML_NATIVE=ON"), cmake, a C++ compiler.
# Usage (what was run on 2026-11-29):
#   tools/reference/build_llama_cpp_exact.sh
#   LLAMA_CPP_LIB_PATH=/tmp/lcp-exact-lib python3 tools/reference/make_golden.py
# Outputs (nothing goes into the repository):
#   /tmp/lcp-exact-lib/     llama-cpp-python's libraries + patched libggml-cpu
#   /tmp/llama.cpp-build/bin/llama-bench, llama-quantize   (stock, unpatched)
set -euo pipefail

VERSION=0.3.36
SDIST_DIR=/tmp/lcp-sdist
SRC="${SDIST_DIR}/llama_cpp_python-${VERSION}/vendor/llama.cpp"
EXACT_SRC=/tmp/llama.cpp-exact-src
EXACT_BUILD=/tmp/llama.cpp-exact-build
LIB_OUT=/tmp/lcp-exact-lib
BENCH_BUILD=/tmp/llama.cpp-build
CMAKE_FLAGS=(-DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF)

if [[ ! -d "${SRC}" ]]; then
  pip download --no-binary :all: --no-deps "llama-cpp-python==${VERSION}" \
    -d "${SDIST_DIR}"
  tar -xzf "${SDIST_DIR}/llama_cpp_python-${VERSION}.tar.gz" -C "${SDIST_DIR}"
fi

PY_LIB="$(python3 -c 'import os, llama_cpp; print(os.path.join(os.path.dirname(llama_cpp.__file__), "lib"))')"
PY_VERSION="$(python3 -c 'import llama_cpp; print(llama_cpp.__version__)')"
if [[ "${PY_VERSION}" != "${VERSION}" ]]; then
  echo "installed llama-cpp-python is ${PY_VERSION}, expected ${VERSION}" >&2
  exit 1
fi

# Exact-GELU libggml-cpu.
rm -rf "${EXACT_SRC}"
cp -r "${SRC}" "${EXACT_SRC}"
VEC_H="${EXACT_SRC}/ggml/src/ggml-cpu/vec.h"
grep -q '^#define GGML_GELU_FP16$' "${VEC_H}"
sed -i 's|^#define GGML_GELU_FP16$|// #define GGML_GELU_FP16  // kvd: exact fp32 GELU|' "${VEC_H}"
cmake -S "${EXACT_SRC}" -B "${EXACT_BUILD}" "${CMAKE_FLAGS[@]}" \
  -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "${EXACT_BUILD}" --target ggml-cpu -j"$(nproc)"
rm -rf "${LIB_OUT}"
mkdir -p "${LIB_OUT}"
cp -a "${PY_LIB}"/. "${LIB_OUT}/"
cp -a "${EXACT_BUILD}"/bin/libggml-cpu.so* "${LIB_OUT}/"

# Stock llama-bench and llama-quantize for benchmarks.
if [[ ! -x "${BENCH_BUILD}/bin/llama-bench" ]]; then
  cmake -S "${SRC}" -B "${BENCH_BUILD}" "${CMAKE_FLAGS[@]}" >/dev/null
  cmake --build "${BENCH_BUILD}" --target llama-bench llama-quantize \
    -j"$(nproc)"
fi
echo "LLAMA_CPP_LIB_PATH=${LIB_OUT}"
