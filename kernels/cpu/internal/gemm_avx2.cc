// AVX2 implementation of the canonical GEMM: the 16 lanes are two 8-lane
// registers (lanes 0-7 and 8-15). Compiled with -mavx2 -mfma only.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/internal/gemm_blocks.h"
#include "kernels/cpu/internal/gemm_isa.h"
#include "kernels/cpu/internal/gemm_pairs.h"
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
  // 32 bf16 in k order: a 32-bit lane holds elements 2r (low half) and
  // 2r + 1 (high half), so the odd element is the lane with its low half
  // cleared and the even one the lane shifted up.
  static void SplitPairs(const uint16_t* p, V* odd, V* even) {
    const __m256i mask = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i hi =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16));
    *odd = {_mm256_castsi256_ps(_mm256_and_si256(lo, mask)),
            _mm256_castsi256_ps(_mm256_and_si256(hi, mask))};
    *even = {_mm256_castsi256_ps(_mm256_slli_epi32(lo, 16)),
             _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16))};
  }
  static void Store(float* p, const V& v) {
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
  }

  // GGML-block decoding (gemm_blocks.h): 16 int32 lanes as two registers.
  struct I {
    __m256i lo, hi;
  };
  static I U8(const uint8_t* p) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return {_mm256_cvtepu8_epi32(b),
            _mm256_cvtepu8_epi32(_mm_srli_si128(b, 8))};
  }
  static I S8(const uint8_t* p) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return {_mm256_cvtepi8_epi32(b),
            _mm256_cvtepi8_epi32(_mm_srli_si128(b, 8))};
  }
  static I Broadcast(uint32_t v) {
    return {_mm256_set1_epi32(v), _mm256_set1_epi32(v)};
  }
  static I AndC(const I& v, int c) {
    const __m256i k = _mm256_set1_epi32(c);
    return {_mm256_and_si256(v.lo, k), _mm256_and_si256(v.hi, k)};
  }
  static I SubC(const I& v, int c) {
    const __m256i k = _mm256_set1_epi32(c);
    return {_mm256_sub_epi32(v.lo, k), _mm256_sub_epi32(v.hi, k)};
  }
  static I Or(const I& a, const I& b) {
    return {_mm256_or_si256(a.lo, b.lo), _mm256_or_si256(a.hi, b.hi)};
  }
  static I Srl(const I& v, int n) {
    return {_mm256_srli_epi32(v.lo, n), _mm256_srli_epi32(v.hi, n)};
  }
  static I Shl(const I& v, int n) {
    return {_mm256_slli_epi32(v.lo, n), _mm256_slli_epi32(v.hi, n)};
  }
  // Lane r shifted right by first + r.
  static I SrlIota(const I& v, int first) {
    const __m256i f = _mm256_set1_epi32(first);
    const __m256i lo =
        _mm256_add_epi32(f, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i hi =
        _mm256_add_epi32(f, _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15));
    return {_mm256_srlv_epi32(v.lo, lo), _mm256_srlv_epi32(v.hi, hi)};
  }
  static V ToFloat(const I& v) {
    return {_mm256_cvtepi32_ps(v.lo), _mm256_cvtepi32_ps(v.hi)};
  }
  static V Mul(const V& v, float s) {
    const __m256 k = _mm256_set1_ps(s);
    return {_mm256_mul_ps(v.lo, k), _mm256_mul_ps(v.hi, k)};
  }
  static V Add(const V& v, float s) {
    const __m256 k = _mm256_set1_ps(s);
    return {_mm256_add_ps(v.lo, k), _mm256_add_ps(v.hi, k)};
  }
  static V Sub(const V& v, float s) {
    const __m256 k = _mm256_set1_ps(s);
    return {_mm256_sub_ps(v.lo, k), _mm256_sub_ps(v.hi, k)};
  }
  // Two 8-lane permutes and a blend cost what convert, multiply and add do.
  static constexpr bool kLut16 = false;
  static V Iota() { return Zero(); }
  static V IotaMinus8() { return Zero(); }
  static V Lut16(const V& table, const I&) { return table; }
  // elementwise.h's FloatToBf16 (nearest-even; a NaN is quieted), widened.
  static __m256 RoundBf16x8(__m256 v) {
    const __m256i b = _mm256_castps_si256(v);
    const __m256i hi = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
    const __m256i lsb =
        _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_and_si256(
        _mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7fff)), lsb),
        hi);
    const __m256i quiet =
        _mm256_and_si256(_mm256_or_si256(b, _mm256_set1_epi32(0x00400000)), hi);
    const __m256i nan =
        _mm256_cmpgt_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff)),
                           _mm256_set1_epi32(0x7f800000));
    return _mm256_castsi256_ps(_mm256_blendv_epi8(r, quiet, nan));
  }
  static V RoundBf16(const V& v) {
    return {RoundBf16x8(v.lo), RoundBf16x8(v.hi)};
  }
  static V Half(const uint8_t* p) {
    return {
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
        _mm256_cvtph_ps(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)))};
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

bool GemmBlocksAvx2(const GemmArgs& a, int64_t n_begin, int64_t n_end) {
  return BlocksRange<Avx2Ops, 2, 3, 1, 4>(a, n_begin, n_end);
}

void GemmPairsAvx2(const GemmArgs& a, int64_t n_begin, int64_t n_end) {
  FlushDenormals flush;
  PairRange<EmulatedPairs<Avx2Ops>, 2, 2, 1>(a, n_begin, n_end);
}

bool DecodeBlocksBf16Avx2(const GemmArgs& a, int64_t n0, int64_t rows,
                          uint16_t* out) {
  return DecodeBlocksBf16<Avx2Ops>(a, n0, rows, out);
}

}  // namespace kvd::kernels::cpu::internal
