#!/usr/bin/env bash
# Runs the thread-heavy unit tests (node, router, cluster, migration, the
# scheduler and session engine, the tiered store, the tensor-parallel
# workers) under ThreadSanitizer. A data race or lock-order inversion fails
# the test that hit it, with both stacks in its log.
#
#   tools/check_tsan.sh                       the default set below
#   tools/check_tsan.sh //services/router:all  any targets
#
# Builds with --config=tsan (.bazelrc) against an abseil built with TSAN
# (tools/build/tsan_absl.sh, cached after the first run). Reports from
# inside system libraries kvd does not build (RocksDB, gRPC, UCX) are
# suppressed (tools/tsan_suppressions.txt): they are not instrumented, so
# TSAN sees only half of their synchronization.
set -euo pipefail
cd "$(dirname "$0")/.."
absl=$(tools/build/tsan_absl.sh)
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=(
    //services/node:all //services/router:all //services/cluster:all
    //services/migration:all //services/worker:all //services/collective:all
    //services/engine:scheduler_test //services/engine:session_engine_test
    //services/engine:streamed_load_test //storage/tiered:all
  )
fi
supp="$PWD/tools/tsan_suppressions.txt"
bazel test --config=tsan \
  --copt="-isystem$absl/include" --linkopt="-L$absl/lib" \
  --linkopt="-Wl,-rpath,$absl/lib" \
  --test_env=LD_LIBRARY_PATH="$absl/lib" \
  --test_env=TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$supp" \
  -- "${targets[@]}"
