#!/usr/bin/env bash
# Builds llama.cpp's own C++ `llama-server` and `llama-bench` from the sources vendored in the
# llama-cpp-python sdist (PyPI is the only registry reachable here), stock and unpatched: the
# peer kvd is measured against in docs/BENCHMARKS.md. Nothing goes into the repository.
#
#   tools/bench/build_llama_server.sh [build_dir]     (default /tmp/llama.cpp-server)
#   -> BUILD_DIR/bin/llama-server, BUILD_DIR/bin/llama-bench
#
# Needs cmake and a C++ compiler (tools/setup.sh installs both); ~10 min on 2 cores.
set -euo pipefail
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
BUILD="${1:-/tmp/llama.cpp-server}"
SDIST_DIR="${BUILD}-sdist"
SRC="${SDIST_DIR}/llama_cpp_python-${VERSION}/vendor/llama.cpp"
PIP="${PIP:-python3 -m pip}"

if [[ ! -d "${SRC}" ]]; then
  mkdir -p "${SDIST_DIR}"
  ${PIP} download --no-binary :all: --no-deps "llama-cpp-python==${VERSION}" -d "${SDIST_DIR}"
  tar -xzf "${SDIST_DIR}/llama_cpp_python-${VERSION}.tar.gz" -C "${SDIST_DIR}"
fi
echo "llama.cpp sources: ${SRC} (llama-cpp-python ${VERSION})"
cmake -S "${SRC}" -B "${BUILD}" -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "${BUILD}" --target llama-server llama-bench -j"$(nproc)"
ls -l "${BUILD}/bin/llama-server" "${BUILD}/bin/llama-bench"
