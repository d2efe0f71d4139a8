// First CUDA kernels: fp32 <-> bf16 conversion on the device, with the same
// rounding (round-to-nearest-even, NaN kept) as kernels/cpu/elementwise.h. They
// exist now so that the nvcc build path (tools/build/defs.bzl:
// kvd_cuda_library) is compiled by every CI run; the CUDA backend (GEMM,
// attention, recompute) follows in the CUDA issue.
//
// Thread-safety: launches on the given stream; the caller owns the device
// buffers.
#ifndef KVD_KERNELS_CUDA_BF16_CONVERT_H_
#define KVD_KERNELS_CUDA_BF16_CONVERT_H_

#include <cstdint>

namespace kvd::kernels::cuda {

// Returns a cudaError_t value (0 = success) so that host code need not include
// CUDA headers.
int LaunchFloatToBf16(const float* src, uint16_t* dst, int64_t n, void* stream);
int LaunchBf16ToFloat(const uint16_t* src, float* dst, int64_t n, void* stream);

}  // namespace kvd::kernels::cuda

#endif  // KVD_KERNELS_CUDA_BF16_CONVERT_H_
