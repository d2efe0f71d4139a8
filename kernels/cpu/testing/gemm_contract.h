// The numerics contract's dot product restated independently of the
// kernels, for their tests (test-only): 16 lanes, lane r takes k = r (mod 16)
// in increasing k with FMA, zero padding, then the fixed pairwise tree; the
// row-parallel grouped sum built from it; the bf16 mode's pair contract; and
// running a test on every ISA the machine has. Include it from code compiled
// with -mfma, so std::fma is the FMA instruction and obeys MXCSR.
#ifndef KVD_KERNELS_CPU_TESTING_GEMM_CONTRACT_H_
#define KVD_KERNELS_CPU_TESTING_GEMM_CONTRACT_H_

#include <xmmintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_features.h"

namespace kvd::kernels::cpu::testing {

inline std::vector<Isa> SupportedIsas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512})
    if (IsaSupported(isa)) out.push_back(isa);
  return out;
}

// Runs the kernels on `isa` while in scope.
class IsaGuard {
 public:
  explicit IsaGuard(Isa isa) : saved_(ActiveIsa()) {
    EXPECT_TRUE(SetIsa(isa).ok());
  }
  ~IsaGuard() { (void)SetIsa(saved_); }
  IsaGuard(const IsaGuard&) = delete;
  IsaGuard& operator=(const IsaGuard&) = delete;

 private:
  Isa saved_;
};

// Deterministic values in about [-1.26, 1.26], exactly representable.
inline std::vector<float> RandomVector(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v(n);
  for (float& x : v)
    x = static_cast<float>(static_cast<int32_t>(rng() % 20001) - 10000) /
        7919.0f;
  return v;
}

inline float ContractDot(const float* a, const float* b, int64_t n) {
  float lane[16] = {};
  for (int64_t k = 0; k < n; ++k)
    lane[k % 16] = std::fma(a[k], b[k], lane[k % 16]);
  // Zero padding of the tail adds fma(0, 0, l) = l + 0, which also turns -0
  // into +0.
  if (n % 16 != 0)
    for (int64_t k = n; k % 16 != 0; ++k)
      lane[k % 16] = std::fma(0.0f, 0.0f, lane[k % 16]);
  float s[8], t[4], u[2];
  for (int i = 0; i < 8; ++i) s[i] = lane[i] + lane[i + 8];
  for (int i = 0; i < 4; ++i) t[i] = s[i] + s[i + 4];
  for (int i = 0; i < 2; ++i) u[i] = t[i] + t[i + 2];
  return u[0] + u[1];
}

// `groups` equal slices of n, one ContractDot each, added in slice order.
inline float ContractGrouped(const float* a, const float* b, int64_t n,
                             int64_t groups) {
  const int64_t slice = n / groups;
  float sum = ContractDot(a, b, slice);
  for (int64_t g = 1; g < groups; ++g)
    sum += ContractDot(a + g * slice, b + g * slice, slice);
  return sum;
}

// Round to nearest-even bf16, as a float (a NaN is quieted).
inline float RoundToBf16Value(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  if ((b & 0x7fffffffu) > 0x7f800000u) {
    b |= 0x00400000u;
  } else {
    b += 0x7fffu + ((b >> 16) & 1u);
  }
  b &= 0xffff0000u;
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}

inline float Bf16Value(uint16_t h) {
  const uint32_t b = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}

// The bf16 pair contract (kernels/cpu/internal/gemm_pairs.h), written
// plainly: x rounded to bf16, n zero-padded to a multiple of 32, lane r adds
// the products of elements 32j + 2r + 1 and then 32j + 2r by FMA, the same
// tree, everything with denormals flushed (MXCSR DAZ and FTZ).
inline float ContractPairDot(const float* x, const uint16_t* w, int64_t n) {
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040u);
  float lane[16] = {};
  for (int64_t run = 0; run < n; run += 32) {
    for (int r = 0; r < 16; ++r) {
      for (const int64_t k : {run + 2 * r + 1, run + 2 * r}) {
        const float a = k < n ? RoundToBf16Value(x[k]) : 0.0f;
        const float b = k < n ? Bf16Value(w[k]) : 0.0f;
        lane[r] = std::fma(a, b, lane[r]);
      }
    }
  }
  float s[8], t[4], u[2];
  for (int i = 0; i < 8; ++i) s[i] = lane[i] + lane[i + 8];
  for (int i = 0; i < 4; ++i) t[i] = s[i] + s[i + 4];
  for (int i = 0; i < 2; ++i) u[i] = t[i] + t[i + 2];
  const float result = u[0] + u[1];
  _mm_setcsr(saved);
  return result;
}

// `groups` slices of n, one ContractPairDot each (each padded on its own),
// added in slice order with denormals flushed.
inline float ContractPairGrouped(const float* x, const uint16_t* w, int64_t n,
                                 int64_t groups) {
  const int64_t slice = n / groups;
  float sum = ContractPairDot(x, w, slice);
  const unsigned saved = _mm_getcsr();
  for (int64_t g = 1; g < groups; ++g) {
    const float part = ContractPairDot(x + g * slice, w + g * slice, slice);
    _mm_setcsr(saved | 0x8040u);
    sum += part;
    _mm_setcsr(saved);
  }
  return sum;
}

// Whether two float vectors hold the same bits (NaNs and signed zeros
// included).
inline bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace kvd::kernels::cpu::testing

#endif  // KVD_KERNELS_CPU_TESTING_GEMM_CONTRACT_H_
