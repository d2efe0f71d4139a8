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
  // The bf16 mode's pair products (gemm_pairs.h): the activations prepared
  // once per call (PreparePairs in gemm.cc), m rows of ldxp elements (bf16
  // for the native path, fp32 in pair order for the emulations), each of the
  // `groups` slices of k zero-padded to slice_pad (a multiple of 32). The
  // weights are bf16 rows (GGML blocks are decoded to bf16 panels first).
  const void* xp = nullptr;
  int64_t ldxp = 0;
  int64_t slice_pad = 0;
};

// How the pair paths want their activations laid out.
enum class PairLayout {
  kBf16,       // bf16 in k order (vdpbf16ps reads pairs of neighbours)
  kPairOrder,  // fp32 in pair order: per 32 values, the 16 odd ones, then
               // the 16 even ones (the emulations' lanes load them directly)
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
// The bf16 pair contract (gemm_pairs.h) over bf16 weight rows: emulated with
// two FMAs per pair under DAZ/FTZ (scalar, AVX2), and natively with
// AVX512-BF16 vdpbf16ps (only where the machine has it).
void GemmPairsScalar(const GemmArgs& a, int64_t n_begin, int64_t n_end);
void GemmPairsAvx2(const GemmArgs& a, int64_t n_begin, int64_t n_end);
void GemmPairsAvx512Bf16(const GemmArgs& a, int64_t n_begin, int64_t n_end);
// The pair contract straight from GGML blocks for up to kDirectPairsMaxRows
// activation rows (bf16 in k order), decoded in registers; false, computing
// nothing, for a type or shape it does not take.
// Up to 8 rows the blocks are decoded in registers once per tile of 8, 4, 2
// or 1 rows; from 9 rows decoding each block once into a bf16 panel for all
// rows wins (SmolLM2 bf16 decode on Zen 4, 2 threads, alternating: batch 8
// 399-444 vs 366-398 tok/s, batch 16 as two tiles of 8 439-444 vs 484-548).
inline constexpr int64_t kDirectPairsMaxRows = 8;
bool GemmBlocksPairsAvx512Bf16(const GemmArgs& a, int64_t n_begin,
                               int64_t n_end);
// Rows [n0, n0 + rows) of GGML-block weights as bf16 (the bf16 mode's
// weights: the dequantized value rounded to nearest-even), `a.k` per row.
void DecodeBlocksBf16Scalar(const GemmArgs& a, int64_t n0, int64_t rows,
                            uint16_t* out);
bool DecodeBlocksBf16Avx2(const GemmArgs& a, int64_t n0, int64_t rows,
                          uint16_t* out);
bool DecodeBlocksBf16Avx512(const GemmArgs& a, int64_t n0, int64_t rows,
                            uint16_t* out);

}  // namespace kvd::kernels::cpu::internal

#endif  // KVD_KERNELS_CPU_INTERNAL_GEMM_ISA_H_
