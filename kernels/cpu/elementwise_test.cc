#include "kernels/cpu/elementwise.h"

#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/internal/exp_avx2.h"

namespace kvd::kernels::cpu {
namespace {

double UlpDistance(float a, double ref) {
  const float r = static_cast<float>(ref);
  const float ulp =
      std::nextafter(std::fabs(r), std::numeric_limits<float>::infinity()) -
      std::fabs(r);
  return std::fabs(a - ref) / ulp;
}

TEST(Exp, WithinTwoUlpOfDoubleExpAcrossTheRange) {
  double worst = 0;
  for (float x = -87.0f; x < 88.5f; x += 0.0137f) {
    worst =
        std::max(worst, UlpDistance(Exp(x), std::exp(static_cast<double>(x))));
  }
  EXPECT_LT(worst, 2.0);
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Inputs over every exponent and sign, plus the edges: a stride through all
// 2^32 bit patterns (NaNs, infinities, zeros and subnormals included).
std::vector<float> SweepInputs() {
  std::vector<float> x;
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 4093) {
    x.push_back(FromBits(static_cast<uint32_t>(u)));
  }
  for (float f : {0.0f, -0.0f, 88.72f, -87.33f, 88.7201f, -87.3301f,
                  std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(), std::nanf(""),
                  -std::nanf(""), 1e-45f, -1e-45f})
    x.push_back(f);
  while (x.size() % 8 != 0) x.push_back(1.0f);
  return x;
}

TEST(Exp, EightLanesGiveTheScalarBits) {
  const std::vector<float> x = SweepInputs();
  for (size_t i = 0; i < x.size(); i += 8) {
    float y[8];
    _mm256_storeu_ps(y, internal::Exp8(_mm256_loadu_ps(&x[i])));
    for (int l = 0; l < 8; ++l)
      ASSERT_EQ(Bits(y[l]), Bits(Exp(x[i + l]))) << "x = " << x[i + l];
  }
}

TEST(SiluMulAndGeluTanhMul, GiveTheScalarBitsAtEveryOffset) {
  const std::vector<float> x = SweepInputs();
  std::vector<float> up(x.size());
  for (size_t i = 0; i < up.size(); ++i) up[i] = 0.5f + (i % 7) * 0.25f;
  std::vector<float> silu(x.size()), gelu(x.size());
  // An odd length: the vector body and the scalar tail both run.
  const int64_t n = static_cast<int64_t>(x.size()) - 3;
  SiluMul(x.data(), up.data(), n, silu.data());
  GeluTanhMul(x.data(), up.data(), n, gelu.data());
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(Bits(silu[i]), Bits(Silu(x[i]) * up[i])) << "x = " << x[i];
    ASSERT_EQ(Bits(gelu[i]), Bits(GeluTanh(x[i]) * up[i])) << "x = " << x[i];
  }
}

TEST(Exp, EdgeCases) {
  EXPECT_EQ(Exp(0.0f), 1.0f);
  EXPECT_EQ(Exp(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(Exp(-100.0f), 0.0f);
  EXPECT_TRUE(std::isinf(Exp(100.0f)));
  EXPECT_TRUE(std::isnan(Exp(std::nanf(""))));
}

TEST(Activations, MatchDoubleReferences) {
  for (float x = -20.0f; x < 20.0f; x += 0.01f) {
    const double xd = x;
    const double silu = xd / (1.0 + std::exp(-xd));
    const double gelu = 0.5 * xd *
                        (1.0 + std::tanh(std::sqrt(2.0 / M_PI) *
                                         (xd + 0.044715 * xd * xd * xd)));
    EXPECT_NEAR(Silu(x), silu, 1e-6 * std::fabs(silu) + 1e-7) << x;
    EXPECT_NEAR(GeluTanh(x), gelu, 1e-6 * std::fabs(gelu) + 1e-7) << x;
  }
}

TEST(RmsNorm, MatchesDoubleReference) {
  std::vector<float> x(576), w(576), y(576);
  for (int i = 0; i < 576; ++i) {
    x[i] = std::sin(i * 0.37f) * 3.0f;
    w[i] = 0.5f + std::cos(i * 0.11f);
  }
  RmsNorm(x.data(), w.data(), 1e-5f, 576, y.data());
  double ss = 0;
  for (float v : x) ss += static_cast<double>(v) * v;
  const double scale = 1.0 / std::sqrt(ss / 576 + 1e-5);
  for (int i = 0; i < 576; ++i) EXPECT_NEAR(y[i], x[i] * scale * w[i], 2e-6);
}

TEST(Rope, MatchesDoubleRotationBothStyles) {
  const int64_t head_dim = 64, rot = 64;
  std::vector<float> cos(rot / 2), sin(rot / 2);
  RopeAngles(1234, 10000.0f, rot, cos.data(), sin.data());
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kHalfSplit}) {
    std::vector<float> x(2 * head_dim);
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::cos(i * 0.7f);
    std::vector<float> y = x;
    Rope(y.data(), 2, head_dim, rot, cos.data(), sin.data(), style);
    for (int h = 0; h < 2; ++h) {
      for (int i = 0; i < rot / 2; ++i) {
        const int a = style == RopeStyle::kInterleaved ? 2 * i : i;
        const int b =
            style == RopeStyle::kInterleaved ? 2 * i + 1 : i + rot / 2;
        const double theta = 1234.0 * std::pow(10000.0, -2.0 * i / rot);
        const double x0 = x[h * head_dim + a], x1 = x[h * head_dim + b];
        EXPECT_NEAR(y[h * head_dim + a],
                    x0 * std::cos(theta) - x1 * std::sin(theta), 1e-6);
        EXPECT_NEAR(y[h * head_dim + b],
                    x0 * std::sin(theta) + x1 * std::cos(theta), 1e-6);
      }
    }
  }
}

// The angles do not depend on which model's angles were computed before
// (RopeAngles keeps the last base's frequencies).
TEST(Rope, AnglesDoNotDependOnThePreviousCall) {
  auto angles = [](int64_t pos, float base, int64_t rot) {
    std::vector<float> cs(rot);
    RopeAngles(pos, base, rot, cs.data(), cs.data() + rot / 2);
    return cs;
  };
  const std::vector<float> a = angles(777, 10000.0f, 64);
  const std::vector<float> b = angles(777, 1000000.0f, 64);
  const std::vector<float> c = angles(777, 10000.0f, 128);
  EXPECT_NE(a, b);
  EXPECT_EQ(angles(777, 10000.0f, 64), a);
  EXPECT_EQ(angles(777, 1000000.0f, 64), b);
  EXPECT_EQ(angles(777, 10000.0f, 128), c);
  for (int i = 0; i < 32; ++i) {
    const double theta = 777.0 * std::pow(10000.0, -2.0 * i / 64);
    EXPECT_EQ(a[i], static_cast<float>(std::cos(theta)));
    EXPECT_EQ(a[32 + i], static_cast<float>(std::sin(theta)));
  }
}

// The array conversion is the scalar rule, over a sweep of bit patterns
// (every sign, exponent, NaN and infinity; mantissas at a stride).
TEST(Bf16, ArrayConversionIsTheScalarRule) {
  std::vector<float> x;
  for (uint64_t b = 0; b <= 0xffffffffu; b += 65521) {
    float f;
    const uint32_t bits = static_cast<uint32_t>(b);
    std::memcpy(&f, &bits, sizeof(f));
    x.push_back(f);
  }
  for (uint32_t bits : {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
                        0x7f7fffffu, 0x00000001u, 0x3f808000u, 0x3f818000u}) {
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    x.push_back(f);
  }
  std::vector<uint16_t> y(x.size());
  FloatToBf16(x.data(), y.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], FloatToBf16(x[i])) << i;
}

TEST(Bf16, RoundsToNearestEvenAndKeepsSpecials) {
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1 + 2^-7: ties to even
  // (1.0).
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: ties to even
  // (up).
  EXPECT_EQ(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
  EXPECT_EQ(Bf16ToFloat(0xc040), -3.0f);
}

}  // namespace
}  // namespace kvd::kernels::cpu
