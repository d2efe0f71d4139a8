// Shared by the device benchmarks (kernels_benchmark.cc, model_benchmark.cc;
// not part of the backend): exit-on-error checks, the RESULT line format
// tools/gpu/device_check.sh parses, and CUDA-event median timing.
//
//   BENCH_OK(Gemm(...));
//   const double t = bench::MedianSeconds(3, 10, nullptr, [&](int i) {...});
//   bench::Result("gemm_decode", tflops, "TFLOP/s", "m=1");
//
// Thread-safety: single-threaded benchmark mains only.
#ifndef KVD_KERNELS_CUDA_INTERNAL_BENCH_UTIL_H_
#define KVD_KERNELS_CUDA_INTERNAL_BENCH_UTIL_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"

// A benchmark has no caller to report to: print where and why, and exit.
#define BENCH_CHECK(expr)                                               \
  do {                                                                  \
    const cudaError_t e_ = (expr);                                      \
    if (e_ != cudaSuccess) {                                            \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, \
                   cudaGetErrorString(e_));                             \
      std::exit(1);                                                     \
    }                                                                   \
  } while (0)
#define BENCH_OK(expr)                                       \
  do {                                                       \
    const absl::Status s_ = (expr);                          \
    if (!s_.ok()) {                                          \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, \
                   s_.ToString().c_str());                   \
      std::exit(1);                                          \
    }                                                        \
  } while (0)

namespace kvd::kernels::cuda::bench {

// "RESULT<TAB>name<TAB>value<TAB>unit<TAB>note", flushed at once.
inline void Result(const std::string& name, double value, const char* unit,
                   const std::string& note) {
  std::printf("RESULT\t%s\t%.4g\t%s\t%s\n", name.c_str(), value, unit,
              note.c_str());
  std::fflush(stdout);
}

// Median seconds of fn(i), i = 0..reps-1, between events recorded on
// `stream`, after `warmup` untimed calls fn(0..warmup-1) and a synchronize:
// of the whole device when stream is null (the legacy stream), else of
// `stream`.
template <typename Fn>
double MedianSeconds(int warmup, int reps, cudaStream_t stream, Fn&& fn) {
  cudaEvent_t a, b;
  BENCH_CHECK(cudaEventCreate(&a));
  BENCH_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) fn(i);
  BENCH_CHECK(stream == nullptr ? cudaDeviceSynchronize()
                                : cudaStreamSynchronize(stream));
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    BENCH_CHECK(cudaEventRecord(a, stream));
    fn(i);
    BENCH_CHECK(cudaEventRecord(b, stream));
    BENCH_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    BENCH_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e-3);
  }
  BENCH_CHECK(cudaEventDestroy(a));
  BENCH_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace kvd::kernels::cuda::bench

#endif  // KVD_KERNELS_CUDA_INTERNAL_BENCH_UTIL_H_
