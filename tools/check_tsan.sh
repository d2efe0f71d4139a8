#!/usr/bin/env bash
# Runs thread-heavy unit tests (router, cluster membership and directory,
# replication, migration, failover and drain, the transports and collective,
# shard workers, the session engine and scheduler, the tiered store, the
# node's HTTP and gRPC front ends and admission) under ThreadSanitizer. A
# data race or lock-order inversion fails the test that hit it, with both
# stacks in its log.
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
  # The threaded packages' unit tests. Left out: the fuzz tests (a
  # libFuzzer build does not run under TSAN), memory_trimmer_test and
  # http_server_test (they measure glibc's allocator, which TSAN replaces,
  # and time client disconnects TSAN slows past their windows; the HTTP
  # front end's threading is async_http_test's), and the model tests of
  # ops/ (one thread pool, covered through the engine's).
  targets=(
    //services/router:all //services/cluster:all //storage/tiered:all
    //services/engine:scheduler_test //services/engine:streamed_load_test
    //services/engine:session_engine_test //services/engine:hot_sessions_test
    //services/engine:session_locks_test
    //services/migration:all //services/transport:all
    //services/collective:all //services/worker:all
    //services/node:admission_test //services/node:async_http_test
    //services/node:auth_test //services/node:grpc_convert_test
    //services/node:grpc_service_test //services/node:metrics_test
    //services/node:openai_generation_test
    //services/node:openai_request_test //services/node:openai_response_test
  )
fi
supp="$PWD/tools/tsan_suppressions.txt"
# The file is read at run time, not a Bazel input: its hash in the test
# environment makes an edit rerun cached tests.
# Compiled against /usr/include/absl: the same headers, from the same source
# and patches, as the instrumented libraries. UCX's memory hooks (libucm)
# intercept the madvise a finishing thread makes after TSAN has dropped that
# thread's state, which crashes every UCX test at its first thread exit; kvd
# registers no memory with UCX, so the tests run with the hooks off.
bazel test --config=tsan --linkopt="-L$absl/lib" \
  --linkopt="-Wl,-rpath,$absl/lib" \
  --test_env=LD_LIBRARY_PATH="$absl/lib" \
  --test_env=TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$supp" \
  --test_env=UCX_MEM_MMAP_HOOK_MODE=none \
  --test_env=KVD_TSAN_SUPPRESSIONS_SHA256="$(sha256sum <"$supp" | cut -c1-64)" \
  -- "${targets[@]}"
