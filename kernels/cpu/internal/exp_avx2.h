// kvd's Exp (elementwise.h) on 8 lanes at once (internal).
//
// Every lane goes through exactly the scalar function's operations: the same
// clamps (with std::min/std::max's NaN behaviour), round-to-nearest, the same
// fused multiply-adds in the same order, the same integer split of 2^n and
// the same final selects. So Exp8(x)[i] == Exp(x[i]) bit for bit; the
// elementwise tests check it over the whole float range.
#ifndef KVD_KERNELS_CPU_INTERNAL_EXP_AVX2_H_
#define KVD_KERNELS_CPU_INTERNAL_EXP_AVX2_H_

#include <immintrin.h>

#include <limits>

namespace kvd::kernels::cpu::internal {

inline __m256 Exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.33f), hi = _mm256_set1_ps(88.72f);
  // std::max(x, lo) is (x < lo ? lo : x) and std::min(v, hi) is
  // (hi < v ? hi : v): max/minps return their second operand on NaN, so the
  // operand order keeps a NaN x.
  const __m256 xc = _mm256_min_ps(hi, _mm256_max_ps(lo, x));
  const __m256 n = _mm256_round_ps(
      _mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
      _MM_FROUND_CUR_DIRECTION | _MM_FROUND_NO_EXC);  // std::nearbyint
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693359375f), xc);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 e = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r),
                                 _mm256_set1_ps(1.0f));
  // n1 = ni / 2 truncating toward zero, as C's integer division does.
  const __m256i ni = _mm256_cvttps_epi32(n);
  const __m256i n1 =
      _mm256_srai_epi32(_mm256_add_epi32(ni, _mm256_srli_epi32(ni, 31)), 1);
  const __m256i n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  const __m256 y = _mm256_mul_ps(_mm256_mul_ps(e, s1), s2);
  const __m256 over = _mm256_cmp_ps(x, hi, _CMP_GT_OQ);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  return _mm256_blendv_ps(_mm256_blendv_ps(y, _mm256_setzero_ps(), under), inf,
                          over);
}

}  // namespace kvd::kernels::cpu::internal

#endif  // KVD_KERNELS_CPU_INTERNAL_EXP_AVX2_H_
