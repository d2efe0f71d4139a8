// AVX-512 implementation of the canonical GEMM: the 16 lanes are one register.
// Compiled with AVX-512 flags; only called after cpu_features confirms the
// machine supports them.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/internal/gemm_isa.h"
#include "kernels/cpu/internal/gemm_tile.h"

namespace kvd::kernels::cpu::internal {
namespace {

struct Avx512Ops {
  using V = __m512;
  static V Zero() { return _mm512_setzero_ps(); }
  static V Load(const float* p) { return _mm512_loadu_ps(p); }
  static V Load(const uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static float Reduce(V v) {
    const __m256 s =
        _mm256_add_ps(_mm512_extractf32x8_ps(v, 0),
                      _mm512_extractf32x8_ps(v, 1));  // l[i] + l[i+8]
    const __m128 t =
        _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    const __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));
    return _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)));
  }
};

}  // namespace

void GemmF32Avx512(const GemmArgs& a, int64_t n_begin, int64_t n_end) {
  GemmRange<Avx512Ops, float, 4, 4, 1>(a, n_begin, n_end);
}

void GemmBf16Avx512(const GemmArgs& a, int64_t n_begin, int64_t n_end) {
  GemmRange<Avx512Ops, uint16_t, 4, 4, 1>(a, n_begin, n_end);
}

}  // namespace kvd::kernels::cpu::internal
