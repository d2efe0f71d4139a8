// Device-memory bandwidth probes for benchmarks: the measured ceiling that
// memory-bound kernels (decode GEMM, attention) are judged against. Buffers
// are filled with non-zero data before timing; each result is the median of
// `reps` timed runs after warm-up, timed with CUDA events.
//
//   absl::StatusOr<double> read_bps = MeasureReadBandwidth(4ull << 30, 20);
//
// Thread-safety: synchronous; uses the current device and the default stream.
#ifndef KVD_KERNELS_CUDA_BANDWIDTH_PROBE_H_
#define KVD_KERNELS_CUDA_BANDWIDTH_PROBE_H_

#include <cstddef>

#include "absl/status/statusor.h"

namespace kvd::kernels::cuda {

// Bytes per second read by a streaming kernel (16-byte loads) over `bytes`.
absl::StatusOr<double> MeasureReadBandwidth(size_t bytes, int reps);

// Bytes per second of cudaMemcpy device-to-device over `bytes`, counting bytes
// read plus bytes written (2 * bytes per copy).
absl::StatusOr<double> MeasureCopyBandwidth(size_t bytes, int reps);

}  // namespace kvd::kernels::cuda

#endif  // KVD_KERNELS_CUDA_BANDWIDTH_PROBE_H_
