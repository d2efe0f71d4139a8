// Per-element GGUF dequantization, shared by the CUDA kernel (dequant.cu)
// and a CPU test (dequant_element_test.cc) that checks it against
// kernels/quant/dequant.cc bit for bit without a GPU. Each function computes
// one element with the CPU dequantizer's operations in its order, every
// product and sum rounded separately: on the device through __fmul_rn and
// friends (which nvcc never contracts into FMAs), on the host through plain
// operators in a file built with -ffp-contract=off.
//
// Blocks are read bytewise (no alignment needed). Element index j is within
// the block: < 32 for Q4_0..Q8_0, < 256 for the K-quants.
#ifndef KVD_KERNELS_CUDA_INTERNAL_DEQUANT_ELEMENT_H_
#define KVD_KERNELS_CUDA_INTERNAL_DEQUANT_ELEMENT_H_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KVD_DQ_FN __host__ __device__ inline
#define KVD_DQ_CONSTEXPR __host__ __device__ constexpr
#else
#define KVD_DQ_FN inline
#define KVD_DQ_CONSTEXPR constexpr
#endif

namespace kvd::kernels::cuda::internal::dequant {

// GGML type ids (ggml.h), the ones supported here.
enum TypeId : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kBF16 = 30,
};

// Elements and bytes per block of a supported type; 0 for any other id.
KVD_DQ_CONSTEXPR int BlockElems(uint32_t id) {
  return (id == kF32 || id == kF16 || id == kBF16) ? 1
         : (id == kQ4_0 || id == kQ4_1 || id == kQ5_0 || id == kQ5_1 ||
            id == kQ8_0)
             ? 32
         : (id == kQ4_K || id == kQ5_K || id == kQ6_K) ? 256
                                                       : 0;
}
KVD_DQ_CONSTEXPR int BlockBytes(uint32_t id) {
  return id == kF32    ? 4
         : id == kF16  ? 2
         : id == kBF16 ? 2
         : id == kQ4_0 ? 18
         : id == kQ4_1 ? 20
         : id == kQ5_0 ? 22
         : id == kQ5_1 ? 24
         : id == kQ8_0 ? 34
         : id == kQ4_K ? 144
         : id == kQ5_K ? 176
         : id == kQ6_K ? 210
                       : 0;
}

KVD_DQ_FN float FloatFromBits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

KVD_DQ_FN uint32_t BitsOfFloat(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

KVD_DQ_FN float Mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

KVD_DQ_FN float Add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

KVD_DQ_FN float Sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

// kernels/quant/half.h Fp16ToFp32: exact, subnormals and NaN payloads kept.
KVD_DQ_FN float Fp16Bits(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    uint32_t e = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    bits = sign | (e << 23) | ((mant & 0x3ffu) << 13);
  }
  return FloatFromBits(bits);
}

KVD_DQ_FN float LoadFp16(const uint8_t* p) {
  return Fp16Bits(static_cast<uint32_t>(p[0]) |
                  (static_cast<uint32_t>(p[1]) << 8));
}

KVD_DQ_FN uint32_t LoadU32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}

// kernels/cpu/elementwise.h FloatToBf16.
KVD_DQ_FN uint16_t ToBf16(float x) {
  uint32_t b = BitsOfFloat(x);
  if ((b & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((b >> 16) | 0x40);
  b += 0x7fffu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}

KVD_DQ_FN void ScaleMinK4(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Element j (< 32) of a 32-element block at b.
KVD_DQ_FN float Q4_0(const uint8_t* b, int j) {
  const float d = LoadFp16(b);
  const uint8_t q = b[2 + (j & 15)];
  const int x = (j < 16 ? (q & 0x0f) : (q >> 4)) - 8;
  return Mul(static_cast<float>(x), d);
}

KVD_DQ_FN float Q4_1(const uint8_t* b, int j) {
  const float d = LoadFp16(b);
  const float m = LoadFp16(b + 2);
  const uint8_t q = b[4 + (j & 15)];
  const int x = j < 16 ? (q & 0x0f) : (q >> 4);
  return Add(Mul(static_cast<float>(x), d), m);
}

// The fifth bit of element j of a Q5 block with high bits qh.
KVD_DQ_FN int Q5High(uint32_t qh, int j) {
  return j < 16 ? static_cast<int>(((qh >> j) << 4) & 0x10)
                : static_cast<int>((qh >> (j - 16 + 12)) & 0x10);
}

KVD_DQ_FN float Q5_0(const uint8_t* b, int j) {
  const float d = LoadFp16(b);
  const uint32_t qh = LoadU32(b + 2);
  const uint8_t q = b[6 + (j & 15)];
  const int x = ((j < 16 ? (q & 0x0f) : (q >> 4)) | Q5High(qh, j)) - 16;
  return Mul(static_cast<float>(x), d);
}

KVD_DQ_FN float Q5_1(const uint8_t* b, int j) {
  const float d = LoadFp16(b);
  const float m = LoadFp16(b + 2);
  const uint32_t qh = LoadU32(b + 4);
  const uint8_t q = b[8 + (j & 15)];
  const int x = (j < 16 ? (q & 0x0f) : (q >> 4)) | Q5High(qh, j);
  return Add(Mul(static_cast<float>(x), d), m);
}

KVD_DQ_FN float Q8_0(const uint8_t* b, int j) {
  const float d = LoadFp16(b);
  return Mul(static_cast<float>(static_cast<int8_t>(b[2 + j])), d);
}

// Element e (< 256) of a 256-element super-block at b. Group g of 64 holds
// sub-blocks 2g (low nibbles of qs[32g, 32g+32)) and 2g+1 (high nibbles).
KVD_DQ_FN float Q4_K(const uint8_t* b, int e) {
  const int g = e >> 6, sub = (e >> 5) & 1, l = e & 31;
  int sc, m;
  ScaleMinK4(2 * g + sub, b + 4, &sc, &m);
  const float d1 = Mul(LoadFp16(b), static_cast<float>(sc));
  const float m1 = Mul(LoadFp16(b + 2), static_cast<float>(m));
  const uint8_t q = b[16 + 32 * g + l];
  const int v = sub == 0 ? (q & 0x0f) : (q >> 4);
  return Sub(Mul(d1, static_cast<float>(v)), m1);
}

KVD_DQ_FN float Q5_K(const uint8_t* b, int e) {
  const int g = e >> 6, sub = (e >> 5) & 1, l = e & 31;
  int sc, m;
  ScaleMinK4(2 * g + sub, b + 4, &sc, &m);
  const float d1 = Mul(LoadFp16(b), static_cast<float>(sc));
  const float m1 = Mul(LoadFp16(b + 2), static_cast<float>(m));
  const uint8_t ql = b[48 + 32 * g + l];
  const uint8_t qh = b[16 + l];
  const int bit = 1 << (2 * g + sub);
  const int v = (sub == 0 ? (ql & 0x0f) : (ql >> 4)) + ((qh & bit) ? 16 : 0);
  return Sub(Mul(d1, static_cast<float>(v)), m1);
}

// Halves of 128; in each, quarter qq of 32 takes (low or high nibble of
// ql[l] or ql[l + 32]) | (2 bits of qh[l] at 2 * qq) << 4, scale sc[l/16 +
// 2qq].
KVD_DQ_FN float Q6_K(const uint8_t* b, int e) {
  const int half = e >> 7, qq = (e >> 5) & 3, l = e & 31;
  const uint8_t* ql = b + 64 * half;
  const uint8_t* qh = b + 128 + 32 * half;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192 + 8 * half);
  const float d = LoadFp16(b + 208);
  const uint8_t lo = ql[l + ((qq & 1) ? 32 : 0)];
  const int nib = (qq & 2) ? (lo >> 4) : (lo & 0x0f);
  const int q =
      static_cast<int8_t>(nib | (((qh[l] >> (2 * qq)) & 3) << 4)) - 32;
  const int s = sc[l / 16 + 2 * qq];
  return Mul(Mul(d, static_cast<float>(s)), static_cast<float>(q));
}

// BF16 is widened to fp32 and rounded back, as the CPU loader does (which
// quiets a signalling NaN).
KVD_DQ_FN float Bf16Bits(const uint8_t* p) {
  return FloatFromBits(
      (static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8)) << 16);
}

// Element j of the block at b of type kType, as the CPU backend's bf16
// weight: the CPU dequantizer's fp32 value rounded by ToBf16.
template <uint32_t kType>
KVD_DQ_FN uint16_t ElementBf16(const uint8_t* b, int j) {
  static_assert(BlockElems(kType) != 0, "unsupported type");
  float v = 0.0f;
  if constexpr (kType == kF32) v = FloatFromBits(LoadU32(b));
  if constexpr (kType == kF16) v = LoadFp16(b);
  if constexpr (kType == kBF16) v = Bf16Bits(b);
  if constexpr (kType == kQ4_0) v = Q4_0(b, j);
  if constexpr (kType == kQ4_1) v = Q4_1(b, j);
  if constexpr (kType == kQ5_0) v = Q5_0(b, j);
  if constexpr (kType == kQ5_1) v = Q5_1(b, j);
  if constexpr (kType == kQ8_0) v = Q8_0(b, j);
  if constexpr (kType == kQ4_K) v = Q4_K(b, j);
  if constexpr (kType == kQ5_K) v = Q5_K(b, j);
  if constexpr (kType == kQ6_K) v = Q6_K(b, j);
  return ToBf16(v);
}

}  // namespace kvd::kernels::cuda::internal::dequant

#undef KVD_DQ_FN
#undef KVD_DQ_CONSTEXPR

#endif  // KVD_KERNELS_CUDA_INTERNAL_DEQUANT_ELEMENT_H_
