#!/usr/bin/env bash
# Builds the threaded packages with Clang's thread-safety analysis as errors:
# GCC, which builds everything else, ignores ABSL_GUARDED_BY,
# ABSL_EXCLUSIVE_LOCKS_REQUIRED and friends, so only this build enforces them.
#
#   tools/check_thread_safety.sh            services, storage, ops, kernels
#   tools/check_thread_safety.sh //services/router/...
#
# It uses an output base of its own (KVD_CLANG_OUTPUT_BASE, default
# ~/.cache/kvd-bazel-clang): switching the compiler re-runs Bazel's toolchain
# detection, which in the default output base would throw away GCC's cache.
# It makes no bazel-* links in the tree: they would point the default build's
# `//...` into this output base.
# About 5 minutes on 2 cores when the disk cache is warm.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=(//services/... //storage/... //ops/... //kernels/cpu/... //base/...)
fi
CC=clang CXX=clang++ bazel \
  --output_base="${KVD_CLANG_OUTPUT_BASE:-$HOME/.cache/kvd-bazel-clang}" \
  --max_idle_secs=60 \
  build --config=thread-safety --symlink_prefix=/ -- "${targets[@]}"
