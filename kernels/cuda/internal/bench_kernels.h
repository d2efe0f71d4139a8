// Small device helpers for model_benchmark.cc only (not part of the backend):
// on-device random fill (so 16 GB of 8B-shaped weights take milliseconds, not
// minutes of host-to-device copies), residual add, and storing projected K/V
// rows into bf16 caches. Each enqueues one kernel on `stream`.
#ifndef KVD_KERNELS_CUDA_INTERNAL_BENCH_KERNELS_H_
#define KVD_KERNELS_CUDA_INTERNAL_BENCH_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace kvd::kernels::cuda::bench {

// p[i] = bf16(offset + scale * u_i), u_i uniform in [-1, 1) from a hash of
// (seed, i): never zeros, reproducible.
absl::Status FillBf16(uint16_t* p, size_t n, uint64_t seed, float scale,
                      float offset, void* stream);
absl::Status FillF32(float* p, size_t n, uint64_t seed, float scale,
                     float offset, void* stream);

// x[r * ld + c] += y[r * ld + c] for r < rows, c < n.
absl::Status AddInPlace(float* x, const float* y, int64_t rows, int64_t n,
                        int64_t ld, void* stream);

// For r < rows: the first `kv_width` values of kv + r * ld go to
// k[dest[r] * kv_width ...] and the next kv_width to v[dest[r] * kv_width ...],
// rounded to bf16. dest: device int32[rows].
absl::Status StoreKv(const float* kv, int64_t ld, int64_t rows,
                     int64_t kv_width, const int32_t* dest, uint16_t* k,
                     uint16_t* v, void* stream);

}  // namespace kvd::kernels::cuda::bench

#endif  // KVD_KERNELS_CUDA_INTERNAL_BENCH_KERNELS_H_
