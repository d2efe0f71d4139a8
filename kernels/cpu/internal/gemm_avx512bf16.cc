// The bf16 pair contract natively (gemm_pairs.h): one AVX512-BF16 vdpbf16ps
// per 32 products. Its own translation unit, compiled with -mavx512bf16 and
// called only where cpu_features reports AVX512-BF16.
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/internal/gemm_isa.h"
#include "kernels/cpu/internal/gemm_pairs.h"

namespace kvd::kernels::cpu::internal {
namespace {

// The lanes' tree of gemm_tile.h: l[i] + l[i+8], + [i+4], + [i+2], + [i+1].
float Reduce(__m512 v) {
  const __m256 s =
      _mm256_add_ps(_mm512_extractf32x8_ps(v, 0), _mm512_extractf32x8_ps(v, 1));
  const __m128 t =
      _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  const __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));
  return _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)));
}

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
      for (int j = 0; j < NR; ++j) out[i][j] = Reduce(acc[i][j]);
  }
};

}  // namespace

void GemmPairsAvx512Bf16(const GemmArgs& a, int64_t n_begin, int64_t n_end) {
  // vdpbf16ps flushes by itself; the tree and the slices' sum must too.
  FlushDenormals flush;
  // One weight row at a time for a single activation row: measured on Zen 4,
  // interleaving two or four rows' streams halved the decode rate.
  PairRange<NativePairs, 4, 4, 1>(a, n_begin, n_end);
}

}  // namespace kvd::kernels::cpu::internal
