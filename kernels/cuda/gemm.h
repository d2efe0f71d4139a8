// Batch-invariant GEMM on the GPU: y = x * W^T, bf16 weights, fp32
// accumulation.
//
// W is row-major, `n` output features by `k` inputs (GGUF's layout), in bf16.
// Activations are fp32 or bf16; fp32 activations are rounded to bf16
// (round-to-nearest-even) as they are loaded, since the tensor cores take bf16
// operands. Every output element is the fp32 accumulation of bf16 tensor-core
// products over k in steps of 16, k = 0, 16, 32, ... in increasing order, with
// one accumulator per element (the tail of k is zero-padded). That order
// depends only on k: whatever the batch size m, the tile configuration or the
// grid, an output row is bit-identical (kernels/cuda/README.md). There is no
// split-K.
//
//   KVD_RETURN_IF_ERROR(Gemm({x, ActType::kF32, m, ldx}, {w, n, k, ldw},
//                            y, ldy, stream));
//
// Thread-safety: enqueues work on `stream` (nullptr: the legacy default
// stream) and returns; the caller owns the device buffers and must keep them
// alive until the stream has run the launch. Argument errors are reported
// before anything is launched.
#ifndef KVD_KERNELS_CUDA_GEMM_H_
#define KVD_KERNELS_CUDA_GEMM_H_

#include <cstdint>

#include "absl/status/status.h"

namespace kvd::kernels::cuda {

enum class ActType { kF32, kBf16 };

// Activations: m rows of k values, row i at data + i * ld (elements).
struct Activations {
  const void* data = nullptr;  // device memory, float or bf16 (uint16_t)
  ActType type = ActType::kF32;
  int64_t m = 0;
  int64_t ld = 0;  // >= k
};

// bf16 weights: n rows of k values, row j at data + j * ld (elements).
struct Bf16Weights {
  const uint16_t* data = nullptr;  // device memory
  int64_t n = 0;
  int64_t k = 0;
  int64_t ld = 0;  // >= k; 0 means k
};

// Tile configurations. All walk k identically, so they give the same bits;
// kAuto picks by m (small tiles for decode-sized batches). Tests force each.
enum class GemmTile { kAuto, kDecode, kPrefill };

// Two implementations of the same contract (kernels/cuda/README.md):
//  - kWmma (gemm.cu): nvcuda::wmma bf16 16x16x16 fragments, 2-stage cp.async;
//  - kMma (gemm_mma.cu): inline-PTX mma.sync m16n8k16 fed by ldmatrix from a
//    4-6 stage cp.async pipeline, larger prefill tiles and a decode tile
//    that spreads n over many blocks.
// Both issue, per output element, the same tensor-core instruction
// (HMMA.16816.F32.BF16: WMMA's m16n16k16 is two of them, one per 8-column
// half) on the same 16 k values into the same fp32 accumulator, k steps in
// increasing order, so they give identical bits; gemm_mma_test checks it.
// kAuto uses kMma only once kMmaGemmVerified is true.
enum class GemmImpl { kAuto, kWmma, kMma };

// Flip to true only after tools/gpu/device_check.sh has run on the device and
// shown gemm_mma_test passing (bit-identity with WMMA) and the mma
// rows of kernels_benchmark / model_benchmark faster than the WMMA ones;
// record that run's date and table in docs/BENCHMARKS.md in the same change.
// Until then every caller that does not ask for kMma gets the WMMA kernel.
inline constexpr bool kMmaGemmVerified = false;

// y[i * ldy + j] = sum_k x[i][k] * W[j][k] for i < x.m, j < w.n (fp32).
// INVALID_ARGUMENT for bad shapes, strides or null pointers; INTERNAL if the
// launch fails.
absl::Status Gemm(const Activations& x, const Bf16Weights& w, float* y,
                  int64_t ldy, void* stream, GemmTile tile = GemmTile::kAuto,
                  GemmImpl impl = GemmImpl::kAuto);

}  // namespace kvd::kernels::cuda

#endif  // KVD_KERNELS_CUDA_GEMM_H_
