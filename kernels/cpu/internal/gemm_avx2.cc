// AVX2 implementation of the canonical GEMM: the 16 lanes are two 8-lane
// registers (lanes 0-7 and 8-15). Compiled with -mavx2 -mfma only.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/internal/gemm_isa.h"
#include "kernels/cpu/internal/gemm_tile.h"

namespace kvd::kernels::cpu::internal {
namespace {

struct Avx2Ops {
  struct V {
    __m256 lo, hi;
  };
  static V Zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static V Load(const float* p) {
    return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
  }
  static __m256 Bf16x8(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static V Load(const uint16_t* p) { return {Bf16x8(p), Bf16x8(p + 8)}; }
  static V Fma(const V& a, const V& b, const V& c) {
    return {_mm256_fmadd_ps(a.lo, b.lo, c.lo),
            _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
  }
  static float Reduce(const V& v) {
    const __m256 s = _mm256_add_ps(v.lo, v.hi);  // s[i] = l[i] + l[i+8]
    const __m128 t =
        _mm_add_ps(_mm256_castps256_ps128(s),
                   _mm256_extractf128_ps(s, 1));  // t[i] = s[i] + s[i+4]
    const __m128 u =
        _mm_add_ps(t, _mm_movehl_ps(t, t));  // u[i] = t[i] + t[i+2]
    return _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)));  // u[0] + u[1]
  }
};

}  // namespace

void GemmF32Avx2(const GemmArgs& a, int64_t n_begin, int64_t n_end) {
  GemmRange<Avx2Ops, float, 2, 3, 1>(a, n_begin, n_end);
}

void GemmBf16Avx2(const GemmArgs& a, int64_t n_begin, int64_t n_end) {
  GemmRange<Avx2Ops, uint16_t, 2, 3, 1>(a, n_begin, n_end);
}

}  // namespace kvd::kernels::cpu::internal
