// IEEE fp16 (binary16) and bfloat16 <-> fp32 conversions, bit-exact and
// independent of the machine's FPU mode (integer code only, no F16C).
//
//  - Fp16ToFp32 / Bf16ToFp32 are exact (every fp16/bf16 value is an fp32
//    value); denormals are kept, NaN payloads are kept.
//  - Fp32ToFp16 rounds to nearest, ties to even; values past the fp16 range
//    become +-inf; NaN stays NaN with its sign and top 10 payload bits (a
//    payload that would vanish becomes 1), as numpy's float32 -> float16 does.
//  - Fp32ToBf16 is GGML's ggml_compute_fp32_to_bf16: round to nearest even,
//    NaN forced quiet (sign and top payload bits kept).
//
// Thread-safety: pure functions.
//
//   uint16_t h = kvd::kernels::Fp32ToFp16(0.1f);     // 0x2e66
//   float f = kvd::kernels::Fp16ToFp32(h);           // 0.0999755859375f
#ifndef KVD_KERNELS_QUANT_HALF_H_
#define KVD_KERNELS_QUANT_HALF_H_

#include <cstdint>
#include <cstring>

namespace kvd::kernels {

namespace half_internal {
inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
}  // namespace half_internal

inline float Fp16ToFp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf or NaN (payload kept)
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    // Subnormal: mant * 2^-24; normalise so the leading one becomes the
    // implicit bit.
    uint32_t e = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    bits = sign | (e << 23) | ((mant & 0x3ffu) << 13);
  }
  return half_internal::BitsFloat(bits);
}

inline uint16_t Fp32ToFp16(float f) {
  const uint32_t u = half_internal::FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a >
      0x7f800000u) {  // NaN: keep the top payload bits; never let it become inf
    const uint32_t payload = (a >> 13) & 0x3ffu;
    return static_cast<uint16_t>(sign | 0x7c00u |
                                 (payload == 0 ? 1u : payload));
  }
  if (a >=
      0x38800000u) {  // |f| >= 2^-14: normal fp16 range (or overflow to inf)
    if (a >= 0x477ff000u)
      return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 -> inf
    // Rebias the exponent, then round the 13 dropped bits to nearest even; a
    // mantissa carry correctly bumps the exponent.
    const uint32_t rebiased = a - (112u << 23);
    const uint32_t rounded = rebiased + 0xfffu + ((rebiased >> 13) & 1u);
    return static_cast<uint16_t>(sign | (rounded >> 13));
  }
  // Subnormal fp16 (or zero): result = round(value / 2^-24).
  const uint32_t exp = a >> 23;
  if (exp < 102)
    return sign;  // below 2^-25: rounds to zero (2^-25 itself ties to even 0)
  const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - exp;  // 14..24
  uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1);
  if (rem > halfway || (rem == halfway && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

inline float Bf16ToFp32(uint16_t b) {
  return half_internal::BitsFloat(static_cast<uint32_t>(b) << 16);
}

inline uint16_t Fp32ToBf16(float f) {
  const uint32_t u = half_internal::FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((u >> 16) | 64u);  // NaN: force quiet
  }
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Bulk forms, for tensors.
inline void Fp16ToFp32(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Fp16ToFp32(src[i]);
}
inline void Fp32ToFp16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Fp32ToFp16(src[i]);
}
inline void Bf16ToFp32(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFp32(src[i]);
}
inline void Fp32ToBf16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Fp32ToBf16(src[i]);
}

}  // namespace kvd::kernels

#endif  // KVD_KERNELS_QUANT_HALF_H_
