// The AVX-512 vector operations of the canonical GEMM and its GGML-block
// decoders (internal): the 16 lanes as one register. Include only from
// translation units compiled with AVX-512 flags (gemm_avx512.cc,
// gemm_avx512bf16.cc); like gemm_tile.h, it sits in an anonymous namespace so
// each gets its own copy.
#ifndef KVD_KERNELS_CPU_INTERNAL_AVX512_OPS_H_
#define KVD_KERNELS_CPU_INTERNAL_AVX512_OPS_H_

#include <immintrin.h>

#include <cstdint>

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
  static void Store(float* p, V v) { _mm512_storeu_ps(p, v); }

  // GGML-block decoding (gemm_blocks.h): 16 int32 lanes.
  using I = __m512i;
  static I U8(const uint8_t* p) {
    return _mm512_cvtepu8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static I S8(const uint8_t* p) {
    return _mm512_cvtepi8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static I Broadcast(uint32_t v) { return _mm512_set1_epi32(v); }
  static I AndC(I v, int c) {
    return _mm512_and_si512(v, _mm512_set1_epi32(c));
  }
  static I SubC(I v, int c) {
    return _mm512_sub_epi32(v, _mm512_set1_epi32(c));
  }
  static I Or(I a, I b) { return _mm512_or_si512(a, b); }
  static I Srl(I v, int n) { return _mm512_srli_epi32(v, n); }
  static I Shl(I v, int n) { return _mm512_slli_epi32(v, n); }
  // Lane r shifted right by first + r.
  static I SrlIota(I v, int first) {
    const I iota =
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm512_srlv_epi32(v,
                             _mm512_add_epi32(iota, _mm512_set1_epi32(first)));
  }
  static V ToFloat(I v) { return _mm512_cvtepi32_ps(v); }
  static V Mul(V v, float s) { return _mm512_mul_ps(v, _mm512_set1_ps(s)); }
  static V Add(V v, float s) { return _mm512_add_ps(v, _mm512_set1_ps(s)); }
  static V Sub(V v, float s) { return _mm512_sub_ps(v, _mm512_set1_ps(s)); }
  // Lane r of the table at the low four bits of idx[r] (vpermps ignores the
  // rest).
  static constexpr bool kLut16 = true;
  static V Iota() {
    return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  }
  static V IotaMinus8() {
    return _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6,
                          7);
  }
  static V Lut16(V table, I idx) { return _mm512_permutexvar_ps(idx, table); }
  // elementwise.h's FloatToBf16 (nearest-even; a NaN is quieted), widened.
  static V RoundBf16(V v) {
    const __m512i b = _mm512_castps_si512(v);
    const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
    const __m512i lsb =
        _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_and_si512(
        _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7fff)), lsb),
        hi);
    const __m512i quiet =
        _mm512_and_si512(_mm512_or_si512(b, _mm512_set1_epi32(0x00400000)), hi);
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(
        _mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff)),
        _mm512_set1_epi32(0x7f800000));
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(nan, r, quiet));
  }
  static V Half(const uint8_t* p) {
    return _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
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
}  // namespace kvd::kernels::cpu::internal

#endif  // KVD_KERNELS_CPU_INTERNAL_AVX512_OPS_H_
