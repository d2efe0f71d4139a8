// Canonical matrix multiplication: y = x * W^T with fp32 accumulation.
//
// W is stored row-major as `rows` output features by `cols` inputs (GGUF's
// layout), in fp32, bf16, or as a GGUF file's quantized blocks (Q4_0, Q4_1,
// Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F16) packed by packed_blocks.h, which
// are dequantized into registers by kernels/quant's formulas right before the
// FMAs, so a blocks view gives the bits of an fp32 view of the dequantized
// rows. Every output element is computed by the canonical
// 16-lane FMA reduction (internal/gemm_tile.h), so a row's result is
// bit-identical whatever the batch size, thread count or ISA (scalar, AVX2,
// AVX-512). There is no split-K: work is divided over output columns.
//
//   WeightView w{WeightType::kF32, data, /*rows=*/n, /*cols=*/k};
//   Gemm(x, /*m=*/tokens, /*ldx=*/k, w, y, /*ldy=*/n, &pool);
//
// Thread-safety: pure function of its inputs; `pool` must not be shared by
// concurrent callers.
#ifndef KVD_KERNELS_CPU_GEMM_H_
#define KVD_KERNELS_CPU_GEMM_H_

#include <cstdint>
#include <initializer_list>

#include "kernels/cpu/packed_blocks.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/quant/ggml_type.h"

namespace kvd::kernels::cpu {

enum class WeightType { kF32, kBf16, kGgmlBlocks };

struct WeightView {
  WeightType type = WeightType::kF32;
  const void* data = nullptr;  // rows x cols elements, row stride `ld` elements
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ld = 0;  // 0 means cols; for blocks a multiple of the block size
  // kGgmlBlocks only: the block type (IsGemmBlockType); data holds rows
  // packed by PackRow, and cols is a whole number of packed blocks.
  GgmlType blocks = GgmlType::kF32;
  // kGgmlBlocks only: the weights are the bf16 rounding (nearest-even) of
  // the dequantized values, the bits of a bf16 view of rows rounded at load
  // (the bf16 mode).
  bool round_to_bf16 = false;
  // The bf16 mode's products (kBf16 or kGgmlBlocks with round_to_bf16): the
  // activations are rounded to bf16 and the reduction follows the bf16 pair
  // contract (internal/gemm_pairs.h; AVX512-BF16 vdpbf16ps's order, with
  // denormals flushed) instead of the 16-lane fp32 one.
  bool bf16_pairs = false;
  int64_t stride() const { return ld == 0 ? cols : ld; }
  // Bytes taken by `elements` consecutive elements of a row (for blocks a
  // whole number of them).
  int64_t bytes_for(int64_t elements) const;
  int64_t row_stride_bytes() const { return bytes_for(stride()); }
};

// y[i * ldy + j] = sum_k x[i * ldx + k] * W[j][k], for i < m and j < w.rows
// (with x[i * ldx + k] rounded to bf16 first where w.bf16_pairs).
// `pool` may be null (single-threaded).
void Gemm(const float* x, int64_t m, int64_t ldx, const WeightView& w, float* y,
          int64_t ldy, ThreadPool* pool);

// One output of GemmShared: y[i * ldy + j] = sum_k x[i * ldx + k] * w[j][k].
struct GemmOutput {
  WeightView w;
  float* y = nullptr;
  int64_t ldy = 0;
};

// Several Gemms of one input x, each element exactly the bits Gemm gives:
// projections that share their input (Q, K and V; the MLP's gate and up).
// Where the weights agree on type, cols and bf16 handling, the activations
// are prepared once and one parallel pass covers every output's rows, so a
// call with few rows pays one fork-join instead of one per weight. Otherwise
// the Gemms run one after another.
void GemmShared(const float* x, int64_t m, int64_t ldx,
                std::initializer_list<GemmOutput> outputs, ThreadPool* pool);

// Gemm with k cut into `groups` equal contiguous slices, each element the
// canonical dot of every slice added in slice order: the row-parallel
// projections (row_parallel_gemm.h). `groups` must divide w.cols; 1 is Gemm.
void GroupedGemm(const float* x, int64_t m, int64_t ldx, const WeightView& w,
                 int64_t groups, float* y, int64_t ldy, ThreadPool* pool);

// The canonical dot product of two fp32 vectors (the 1 x 1 case of Gemm).
float Dot(const float* a, const float* b, int64_t n);

}  // namespace kvd::kernels::cpu

#endif  // KVD_KERNELS_CPU_GEMM_H_
