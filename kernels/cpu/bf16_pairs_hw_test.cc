// The bf16 pair contract (internal/gemm_pairs.h) is vdpbf16ps's arithmetic,
// checked on this machine: each lane adds the odd element's product and then
// the even one's, each an FMA rounded to nearest-even, with denormals flushed
// (DAZ and FTZ). NaN payloads are left out: which NaN operand propagates
// differs. Skipped where the machine has no AVX512-BF16 (the GEMM then never
// uses it).
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <random>

#include "absl/base/casts.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/testing/gemm_contract.h"

namespace kvd::kernels::cpu {
namespace {

using testing::Bf16Value;
float FromBits(uint32_t b) { return absl::bit_cast<float>(b); }
uint32_t Bits(float f) { return absl::bit_cast<uint32_t>(f); }

// Values that reach every corner: any bits, zeros and subnormals, infinities
// and NaNs, and normal numbers whose products land near the subnormal range.
class Values {
 public:
  explicit Values(uint64_t seed) : rng_(seed) {}
  uint16_t Bf16() {
    const uint32_t r = static_cast<uint32_t>(rng_());
    switch (r % 8) {
      case 0:
        return static_cast<uint16_t>(r >> 16);
      case 1:
        return static_cast<uint16_t>((r >> 16) & 0x807f);
      case 2:
        return static_cast<uint16_t>(((r >> 16) & 0x807f) | 0x7f80);
      default:
        return static_cast<uint16_t>((r >> 31) << 15 | Exponent(r) << 7 |
                                     ((r >> 3) & 0x7f));
    }
  }
  uint32_t Fp32() {
    const uint32_t r = static_cast<uint32_t>(rng_());
    const uint32_t m = static_cast<uint32_t>(rng_());
    switch (r % 6) {
      case 0:
        return m;
      case 1:
        return m & 0x807fffffu;
      default:
        return (r >> 31) << 31 | Exponent(r) << 23 | (m & 0x7fffff);
    }
  }

 private:
  // Biased exponents around 1, and now and then near 2^-126.
  static uint32_t Exponent(uint32_t r) {
    int e = 127 + static_cast<int>((r >> 8) % 60) - 30;
    if (r % 16 == 3) e -= 90;
    return static_cast<uint32_t>(e < 1 ? 1 : e);
  }
  std::mt19937_64 rng_;
};

__attribute__((target("avx512f,avx512bf16"))) void Hardware(const float* acc,
                                                            const uint16_t* a,
                                                            const uint16_t* b,
                                                            float* out) {
  const __m512 r = _mm512_dpbf16_ps(
      _mm512_loadu_ps(acc), reinterpret_cast<__m512bh>(_mm512_loadu_si512(a)),
      reinterpret_cast<__m512bh>(_mm512_loadu_si512(b)));
  _mm512_storeu_ps(out, r);
}

TEST(Bf16PairsOnThisMachine, VdpBf16PsIsTwoFmasOddFirstWithDenormalsFlushed) {
  if (!HasAvx512Bf16()) GTEST_SKIP() << "no AVX512-BF16 on this machine";
  Values values(42);
  int64_t compared = 0, nans = 0, flushed = 0;
  for (int it = 0; it < 100000; ++it) {
    float acc[16], hw[16], emu[16];
    uint16_t a[32], b[32];
    for (int i = 0; i < 32; ++i) {
      a[i] = values.Bf16();
      b[i] = values.Bf16();
    }
    for (float& v : acc) v = FromBits(values.Fp32());
    Hardware(acc, a, b, hw);
    const unsigned saved = _mm_getcsr();
    _mm_setcsr(saved | 0x8040u);  // DAZ and FTZ
    for (int r = 0; r < 16; ++r) {
      const float t =
          std::fma(Bf16Value(a[2 * r + 1]), Bf16Value(b[2 * r + 1]), acc[r]);
      emu[r] = std::fma(Bf16Value(a[2 * r]), Bf16Value(b[2 * r]), t);
    }
    _mm_setcsr(saved);
    for (int r = 0; r < 16; ++r) {
      if (std::isnan(hw[r]) && std::isnan(emu[r])) {
        ++nans;
        continue;
      }
      ++compared;
      flushed += hw[r] == 0.0f && acc[r] != 0.0f;
      ASSERT_EQ(Bits(hw[r]), Bits(emu[r]))
          << "acc " << acc[r] << " odd " << Bf16Value(a[2 * r + 1]) << " * "
          << Bf16Value(b[2 * r + 1]) << " even " << Bf16Value(a[2 * r]) << " * "
          << Bf16Value(b[2 * r]) << ": vdpbf16ps " << hw[r] << ", two FMAs "
          << emu[r];
    }
  }
  EXPECT_GT(nans, 0);
  EXPECT_GT(flushed, 0);
  std::printf("%lld lanes compared bit for bit, %lld NaN lanes skipped\n",
              static_cast<long long>(compared), static_cast<long long>(nans));
}

// The cases that pin the order and the roundings down, one by one.
TEST(Bf16PairsOnThisMachine, OrderRoundingAndFlushCases) {
  if (!HasAvx512Bf16()) GTEST_SKIP() << "no AVX512-BF16 on this machine";
  auto lane0 = [](float acc, float even_a, float odd_a) {
    float accs[16] = {acc}, out[16];
    uint16_t a[32] = {}, b[32] = {};
    a[0] = static_cast<uint16_t>(Bits(even_a) >> 16);
    a[1] = static_cast<uint16_t>(Bits(odd_a) >> 16);
    b[0] = b[1] = 0x3f80;  // 1.0
    Hardware(accs, a, b, out);
    return out[0];
  };
  // Two roundings, not one: 1 + 2^-24 + 2^-24 stays 1.
  EXPECT_EQ(lane0(1.0f, std::ldexp(1.0f, -24), std::ldexp(1.0f, -24)), 1.0f);
  // The odd product first: 1 + 2^-30 rounds to 1, then -1 gives 0.
  EXPECT_EQ(lane0(1.0f, -1.0f, std::ldexp(1.0f, -30)), 0.0f);
  EXPECT_EQ(lane0(1.0f, std::ldexp(1.0f, -30), -1.0f), std::ldexp(1.0f, -30));
  // A subnormal result is flushed to zero.
  EXPECT_EQ(lane0(std::ldexp(1.5f, -126), -std::ldexp(1.0f, -126), 0.0f), 0.0f);
}

}  // namespace
}  // namespace kvd::kernels::cpu
