// The bf16 mode's GEMM: the bf16 pair contract (internal; use
// kernels/cpu/gemm.h with WeightView::bf16_pairs).
//
// Why: AVX512-BF16's vdpbf16ps multiplies pairs of bf16 values into fp32
// lanes at twice the fp32 FMA rate. Its order is fixed by the hardware, so
// the contract takes that order and every other path emulates it bit for bit:
//
//   - the activations are rounded to bf16 (nearest-even, elementwise.h's
//     FloatToBf16), the weights are bf16;
//   - k is zero-padded to a multiple of 32; 16 fp32 lane accumulators start at
//     +0; for each run of 32 values j = 0, 1, ..., lane r adds the product of
//     element 32j + 2r + 1 and then that of element 32j + 2r, each one fused
//     multiply-add rounded to nearest-even (a product of two bf16 values is
//     exact in fp32);
//   - everything runs with denormals flushed: a bf16 subnormal input counts
//     as zero and a subnormal result becomes a zero of its sign (DAZ and FTZ,
//     as vdpbf16ps does whatever MXCSR says), the lanes' fixed tree (the same
//     as gemm_tile.h's) and the sum of row-parallel slices included;
//   - NaN payloads are not part of the contract (which NaN operand propagates
//     differs between vdpbf16ps and FMA).
//
// This was measured, not read: kernels/cpu/bf16_pairs_hw_test compares
// vdpbf16ps with the two-FMA emulation over random bits, subnormals and
// specials on the machine it runs on.
//
// The emulations (scalar, AVX2) set MXCSR's DAZ and FTZ for the duration of a
// call and restore it; the activations arrive in pair order (odd elements
// then even ones per 32) so their lanes load directly, and each 32 bf16
// weights split into odd and even lanes with one AND and one shift.
#ifndef KVD_KERNELS_CPU_INTERNAL_GEMM_PAIRS_H_
#define KVD_KERNELS_CPU_INTERNAL_GEMM_PAIRS_H_

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/internal/gemm_isa.h"

namespace kvd::kernels::cpu::internal {
namespace {

constexpr int64_t kPairRun = 32;

// Floats that are bf16 values already (the bf16 mode's decoded weights) as
// bf16: their high halves, exactly.
inline void ExactBf16(const float* in, uint16_t* out, int64_t n) {
  for (int64_t t = 0; t < n; ++t) {
    uint32_t bits;
    std::memcpy(&bits, &in[t], sizeof(bits));
    out[t] = static_cast<uint16_t>(bits >> 16);
  }
}

// MXCSR with DAZ (bit 6) and FTZ (bit 15) set while in scope.
class FlushDenormals {
 public:
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }
  ~FlushDenormals() { _mm_setcsr(saved_); }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  unsigned saved_;
};

// One MR x NR block of outputs over one slice of k: Kernel::Dot accumulates
// `k` weights per row (the last run zero-padded) against activations of type
// Kernel::X and leaves the reduced sums in out.
template <class Kernel, int MR, int NR>
inline void PairTile(const GemmArgs& a, int64_t m0, int64_t n0) {
  using X = typename Kernel::X;
  const X* x = static_cast<const X*>(a.xp) + m0 * a.ldxp;
  const uint16_t* w = static_cast<const uint16_t*>(a.w) + n0 * a.ldw;
  const int64_t slice = a.k / a.groups;
  float sum[MR][NR], part[MR][NR];
  Kernel::template Dot<MR, NR>(x, a.ldxp, w, a.ldw, slice, sum);
  for (int64_t g = 1; g < a.groups; ++g) {
    Kernel::template Dot<MR, NR>(x + g * a.slice_pad, a.ldxp, w + g * slice,
                                 a.ldw, slice, part);
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) sum[i][j] += part[i][j];
  }
  float* y = a.y + m0 * a.ldy + n0;
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[i * a.ldy + j] = sum[i][j];
}

// Rows [m0, m0 + mr) and columns [n0, n0 + nr) with the full tile where it
// fits and single rows of NR or single columns elsewhere (same order).
template <class Kernel, int MR, int NR>
inline void PairTileAny(const GemmArgs& a, int64_t m0, int mr, int64_t n0,
                        int nr) {
  if (mr == MR && nr == NR) return PairTile<Kernel, MR, NR>(a, m0, n0);
  for (int i = 0; i < mr; ++i) {
    int j = 0;
    for (; j + NR <= nr; j += NR) PairTile<Kernel, 1, NR>(a, m0 + i, n0 + j);
    for (; j < nr; ++j) PairTile<Kernel, 1, 1>(a, m0 + i, n0 + j);
  }
}

template <class Kernel, int MR, int NR, int NR1>
inline void PairRange(const GemmArgs& a, int64_t n_begin, int64_t n_end) {
  if (a.m == 1) {
    int64_t n = n_begin;
    for (; n + NR1 <= n_end; n += NR1) PairTile<Kernel, 1, NR1>(a, 0, n);
    for (; n < n_end; ++n) PairTile<Kernel, 1, 1>(a, 0, n);
    return;
  }
  constexpr int64_t kRowBlock = 64;
  for (int64_t m_blk = 0; m_blk < a.m; m_blk += kRowBlock) {
    const int64_t m_end = m_blk + kRowBlock < a.m ? m_blk + kRowBlock : a.m;
    for (int64_t n = n_begin; n < n_end; n += NR) {
      const int nr = static_cast<int>(n_end - n < NR ? n_end - n : NR);
      for (int64_t m = m_blk; m < m_end; m += MR) {
        const int mr = static_cast<int>(m_end - m < MR ? m_end - m : MR);
        PairTileAny<Kernel, MR, NR>(a, m, mr, n, nr);
      }
    }
  }
}

// The emulation over an ISA's 16-lane fp32 vector (Ops as in gemm_tile.h plus
// SplitPairs, which turns 32 bf16 in k order into the odd and the even
// elements as fp32, lane r holding elements 2r + 1 and 2r). Must run under
// FlushDenormals.
template <class Ops>
struct EmulatedPairs {
  using X = float;
  template <int MR, int NR>
  static void Dot(const float* x, int64_t ldx, const uint16_t* w, int64_t ldw,
                  int64_t k, float out[MR][NR]) {
    typename Ops::V acc[MR][NR];
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) acc[i][j] = Ops::Zero();
    auto step = [&](const float* xr, const uint16_t* const* wr) {
      for (int j = 0; j < NR; ++j) {
        typename Ops::V odd, even;
        Ops::SplitPairs(wr[j], &odd, &even);
        for (int i = 0; i < MR; ++i) {
          acc[i][j] = Ops::Fma(Ops::Load(xr + i * ldx), odd, acc[i][j]);
          acc[i][j] = Ops::Fma(Ops::Load(xr + i * ldx + 16), even, acc[i][j]);
        }
      }
    };
    const int64_t k_full = k / kPairRun * kPairRun;
    const uint16_t* wr[NR];
    for (int64_t kk = 0; kk < k_full; kk += kPairRun) {
      for (int j = 0; j < NR; ++j) wr[j] = w + j * ldw + kk;
      step(x + kk, wr);
    }
    if (k_full < k) {
      uint16_t tail[NR][kPairRun] = {};
      for (int j = 0; j < NR; ++j) {
        std::memcpy(tail[j], w + j * ldw + k_full,
                    (k - k_full) * sizeof(uint16_t));
        wr[j] = tail[j];
      }
      step(x + k_full, wr);
    }
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) out[i][j] = Ops::Reduce(acc[i][j]);
  }
};

// GGML-block weights under the pair contract: panels of rows decoded to bf16
// by `decode`, then the pair tiles over them.
template <class DecodeFn, class PairFn>
inline void BlocksAsPairs(const GemmArgs& a, int64_t n_begin, int64_t n_end,
                          DecodeFn decode, PairFn pairs) {
  constexpr int64_t kRows = 16;
  thread_local std::vector<uint16_t> panel;
  panel.resize(kRows * a.k);
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kRows) {
    const int64_t rows = n_end - n0 < kRows ? n_end - n0 : kRows;
    decode(a, n0, rows, panel.data());
    GemmArgs f = a;
    f.w = panel.data();
    f.ldw = a.k;
    f.y = a.y + n0;
    pairs(f, 0, rows);
  }
}

}  // namespace
}  // namespace kvd::kernels::cpu::internal

#endif  // KVD_KERNELS_CPU_INTERNAL_GEMM_PAIRS_H_
