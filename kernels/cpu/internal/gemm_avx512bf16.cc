// The bf16 pair contract natively (gemm_pairs.h): one AVX512-BF16 vdpbf16ps
// per 32 products. Its own translation unit, compiled with -mavx512bf16 and
// called only where cpu_features reports AVX512-BF16.
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/internal/avx512_ops.h"
#include "kernels/cpu/internal/gemm_blocks.h"
#include "kernels/cpu/internal/gemm_isa.h"
#include "kernels/cpu/internal/gemm_pairs.h"

namespace kvd::kernels::cpu::internal {
namespace {

struct NativePairs {
  using X = uint16_t;
  template <int MR, int NR>
  static void Dot(const uint16_t* x, int64_t ldx, const uint16_t* w,
                  int64_t ldw, int64_t k, float out[MR][NR]) {
    __m512 acc[MR][NR];
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
    const int64_t k_full = k / kPairRun * kPairRun;
    for (int64_t kk = 0; kk < k_full; kk += kPairRun) {
      __m512bh xv[MR];
      for (int i = 0; i < MR; ++i)
        xv[i] =
            reinterpret_cast<__m512bh>(_mm512_loadu_si512(x + i * ldx + kk));
      for (int j = 0; j < NR; ++j) {
        if (MR == 1) __builtin_prefetch(w + (j + NR) * ldw + kk, 0, 0);
        const __m512bh wv =
            reinterpret_cast<__m512bh>(_mm512_loadu_si512(w + j * ldw + kk));
        for (int i = 0; i < MR; ++i)
          acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv[i], wv);
      }
    }
    if (k_full < k) {
      // The activations are zero-padded already; masked loads give the
      // weights' zeros.
      const __mmask32 mask = (uint32_t{1} << (k - k_full)) - 1;
      for (int j = 0; j < NR; ++j) {
        const __m512bh wv = reinterpret_cast<__m512bh>(
            _mm512_maskz_loadu_epi16(mask, w + j * ldw + k_full));
        for (int i = 0; i < MR; ++i)
          acc[i][j] =
              _mm512_dpbf16_ps(acc[i][j],
                               reinterpret_cast<__m512bh>(
                                   _mm512_loadu_si512(x + i * ldx + k_full)),
                               wv);
      }
    }
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) out[i][j] = Avx512Ops::Reduce(acc[i][j]);
  }
};

// GGML blocks for a few activation rows, decoded in registers: each two
// consecutive groups of 16 weights (rounded to bf16, so the conversion is
// exact) become one register of 32 bf16 in k order for vdpbf16ps. Runs under
// FlushDenormals: the decoders' values are zero or at least 2^-24 in
// magnitude (fp16 scales times small integers), so DAZ and FTZ cannot change
// them.
template <class T, int MR, int NR>
void DirectAccumulate(const uint16_t* x, int64_t ldx, const uint8_t* w,
                      int64_t ldw_bytes, int64_t nblocks,
                      __m512 (&acc)[MR][NR]) {
  constexpr int kGroups = T::kBlock / 16;
  __m512 first[NR];
  for (int64_t blk = 0; blk < nblocks; ++blk) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      const uint8_t* wb = w + j * ldw_bytes + blk * T::kBytes;
      // 1 KiB ahead in the row: decode streams weights from DRAM.
      __builtin_prefetch(wb + 1024, 0, 0);
      T::template Decode<Avx512Ops, true>(wb, [&](__m512 v, int g) {
        const int64_t c = blk * kGroups + g;  // group of 16 in the slice
        if (c % 2 == 0) {
          first[j] = v;
          return;
        }
        const __m512bh wv = _mm512_cvtne2ps_pbh(v, first[j]);
        const uint16_t* xr = x + (c - 1) * 16;
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i)
          acc[i][j] = _mm512_dpbf16_ps(
              acc[i][j],
              reinterpret_cast<__m512bh>(_mm512_loadu_si512(xr + i * ldx)), wv);
      });
    }
  }
}

template <class T, int MR, int NR>
void DirectTile(const GemmArgs& a, const uint16_t* x, float* y, int64_t n0) {
  const auto* w = static_cast<const uint8_t*>(a.w) + n0 * a.ldw;
  const int64_t slice = a.k / a.groups, slice_blocks = slice / T::kBlock;
  float sum[MR][NR] = {};
  for (int64_t g = 0; g < a.groups; ++g) {
    __m512 acc[MR][NR];
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
    DirectAccumulate<T, MR, NR>(x + g * a.slice_pad, a.ldxp,
                                w + g * slice_blocks * T::kBytes, a.ldw,
                                slice_blocks, acc);
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) {
        const float p = Avx512Ops::Reduce(acc[i][j]);
        sum[i][j] = g == 0 ? p : sum[i][j] + p;
      }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[i * a.ldy + n0 + j] = sum[i][j];
}

template <class T, int MR, int NR>
void DirectRows(const GemmArgs& a, const uint16_t* x, float* y, int64_t n_begin,
                int64_t n_end) {
  int64_t n = n_begin;
  for (; n + NR <= n_end; n += NR) DirectTile<T, MR, NR>(a, x, y, n);
  for (; n < n_end; ++n) DirectTile<T, MR, 1>(a, x, y, n);
}

}  // namespace

bool GemmBlocksPairsAvx512Bf16(const GemmArgs& a, int64_t n_begin,
                               int64_t n_end) {
  if (a.m > kDirectPairsMaxRows) return false;
  FlushDenormals flush;
  return VisitBlockType(a.blocks, [&](auto tag) {
    using T = decltype(tag);
    const int64_t slice = a.k / a.groups;
    if (slice % T::kBlock != 0 || slice % kPairRun != 0) return false;
    const auto* x = static_cast<const uint16_t*>(a.xp);
    // Tiles of 8, 4, 2 and 1 rows: each block is decoded once per tile, and
    // every output element gets the same operations whatever its tile.
    for (int64_t i = 0; i < a.m;) {
      const uint16_t* xi = x + i * a.ldxp;
      float* yi = a.y + i * a.ldy;
      const int64_t left = a.m - i;
      if (left >= 8) {
        DirectRows<T, 8, 1>(a, xi, yi, n_begin, n_end);
        i += 8;
      } else if (left >= 4) {
        DirectRows<T, 4, 1>(a, xi, yi, n_begin, n_end);
        i += 4;
      } else if (left >= 2) {
        DirectRows<T, 2, 1>(a, xi, yi, n_begin, n_end);
        i += 2;
      } else {
        DirectRows<T, 1, 2>(a, xi, yi, n_begin, n_end);
        i += 1;
      }
    }
    return true;
  });
}

void GemmPairsAvx512Bf16(const GemmArgs& a, int64_t n_begin, int64_t n_end) {
  // vdpbf16ps flushes by itself; the tree and the slices' sum must too.
  FlushDenormals flush;
  // A single activation row goes to the AVX2 emulation (gemm.cc); should one
  // come here, it takes one weight row at a time, as interleaving two or four
  // rows' streams halved the decode rate on Zen 4.
  PairRange<NativePairs, 4, 4, 1>(a, n_begin, n_end);
}

}  // namespace kvd::kernels::cpu::internal
