// The mma.sync GEMM's launcher (gemm_mma.cu), called by Gemm (gemm.cu) after
// it has validated the arguments; not an entry point of its own, so both
// implementations share one set of argument checks.
#ifndef KVD_KERNELS_CUDA_INTERNAL_GEMM_MMA_H_
#define KVD_KERNELS_CUDA_INTERNAL_GEMM_MMA_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/gemm.h"

namespace kvd::kernels::cuda::internal {

// Largest m the decode tile takes under GemmTile::kAuto.
inline constexpr int64_t kMmaDecodeMaxM = 16;

// x.m > 0, n > 0, k > 0, strides and pointers valid (Gemm checked them);
// `tile` is kDecode or kPrefill; ldw is the resolved weight stride.
absl::Status GemmMma(const Activations& x, const Bf16Weights& w, int64_t ldw,
                     float* y, int64_t ldy, void* stream, GemmTile tile);

}  // namespace kvd::kernels::cuda::internal

#endif  // KVD_KERNELS_CUDA_INTERNAL_GEMM_MMA_H_
