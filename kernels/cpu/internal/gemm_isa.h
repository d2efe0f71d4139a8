// Per-ISA entry points of the canonical GEMM (internal; use
// kernels/cpu/gemm.h).
//
// Each ISA lives in its own translation unit compiled with that ISA's flags, so
// no instruction of a wider ISA can leak into code that runs on a narrower
// machine.
#ifndef KVD_KERNELS_CPU_INTERNAL_GEMM_ISA_H_
#define KVD_KERNELS_CPU_INTERNAL_GEMM_ISA_H_

#include <cstdint>

#include "kernels/quant/ggml_type.h"

namespace kvd::kernels::cpu::internal {

// y[i * ldy + j] = canonical_dot(x[i * ldx ...], w[j * ldw ...], k) for i < m,
// n_begin <= j < n_end.
struct GemmArgs {
  const float* x;
  int64_t m;
  int64_t ldx;
  const void* w;  // float or bf16 (uint16_t) rows, or GGML blocks
  int64_t ldw;    // in elements; in bytes for GGML blocks
  int64_t k;
  float* y;
  int64_t ldy;
  // > 1: k in `groups` equal slices, one canonical dot each, added in order.
  int64_t groups = 1;
  // The block type of GGML-block weights (GemmBlocks*).
  GgmlType blocks = GgmlType::kF32;
  // GGML blocks only: each weight is the bf16 rounding of its dequantized
  // value (the bf16 mode).
  bool round_bf16 = false;
};

void GemmF32Scalar(const GemmArgs& a, int64_t n_begin, int64_t n_end);
void GemmBf16Scalar(const GemmArgs& a, int64_t n_begin, int64_t n_end);
void GemmF32Avx2(const GemmArgs& a, int64_t n_begin, int64_t n_end);
void GemmBf16Avx2(const GemmArgs& a, int64_t n_begin, int64_t n_end);
void GemmF32Avx512(const GemmArgs& a, int64_t n_begin, int64_t n_end);
void GemmBf16Avx512(const GemmArgs& a, int64_t n_begin, int64_t n_end);
// Packed GGML-block weights (gemm_blocks.h). The vector ones return false for
// a type or shape they do not take, and the caller then uses the scalar one.
void GemmBlocksScalar(const GemmArgs& a, int64_t n_begin, int64_t n_end);
bool GemmBlocksAvx2(const GemmArgs& a, int64_t n_begin, int64_t n_end);
bool GemmBlocksAvx512(const GemmArgs& a, int64_t n_begin, int64_t n_end);

}  // namespace kvd::kernels::cpu::internal

#endif  // KVD_KERNELS_CPU_INTERNAL_GEMM_ISA_H_
