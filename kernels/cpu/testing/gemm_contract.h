// The numerics contract's dot product restated independently of the
// kernels, for their tests (test-only): 16 lanes, lane r takes k = r (mod 16)
// in increasing k with FMA, zero padding, then the fixed pairwise tree; the
// row-parallel grouped sum built from it; and running a test on every ISA
// the machine has.
#ifndef KVD_KERNELS_CPU_TESTING_GEMM_CONTRACT_H_
#define KVD_KERNELS_CPU_TESTING_GEMM_CONTRACT_H_

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

// Whether two float vectors hold the same bits (NaNs and signed zeros
// included).
inline bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace kvd::kernels::cpu::testing

#endif  // KVD_KERNELS_CPU_TESTING_GEMM_CONTRACT_H_
