// fp16/bf16 conversions against numpy (fp16) and gguf-py's port of GGML's
// fp32->bf16 (tools/reference/make_dequant_golden.py ->
// tests/golden/dequant/half_golden.json), plus hand-checked edge cases.
#include "kernels/quant/half.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kvd::kernels {
namespace {

float F(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

nlohmann::json LoadGolden() {
  std::ifstream in("tests/golden/dequant/half_golden.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

TEST(HalfTest, Fp32ToFp16AndBf16MatchReference) {
  const nlohmann::json g = LoadGolden();
  const auto& in = g["f32_bits"];
  const auto& fp16 = g["fp16_bits"];
  const auto& bf16 = g["bf16_bits"];
  ASSERT_GT(in.size(), 1000u);
  ASSERT_EQ(in.size(), fp16.size());
  ASSERT_EQ(in.size(), bf16.size());
  int bad = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const uint32_t x = in[i].get<uint32_t>();
    const uint16_t h = Fp32ToFp16(F(x));
    const uint16_t b = Fp32ToBf16(F(x));
    if (h != fp16[i].get<uint16_t>() && ++bad < 10) {
      ADD_FAILURE() << std::hex << "fp16 of 0x" << x << ": got 0x" << h
                    << " want 0x" << fp16[i].get<uint16_t>();
    }
    if (b != bf16[i].get<uint16_t>() && ++bad < 10) {
      ADD_FAILURE() << std::hex << "bf16 of 0x" << x << ": got 0x" << b
                    << " want 0x" << bf16[i].get<uint16_t>();
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(HalfTest, Fp16ToFp32MatchesReference) {
  const nlohmann::json g = LoadGolden();
  const auto& in = g["fp16_in"];
  const auto& want = g["fp16_to_f32_bits"];
  ASSERT_EQ(in.size(), want.size());
  ASSERT_GT(in.size(), 4096u);
  int bad = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const uint16_t h = in[i].get<uint16_t>();
    const uint32_t got = Bits(Fp16ToFp32(h));
    if (got != want[i].get<uint32_t>() && ++bad < 10) {
      ADD_FAILURE() << std::hex << "fp16 0x" << h << ": got 0x" << got
                    << " want 0x" << want[i].get<uint32_t>();
    }
  }
  EXPECT_EQ(bad, 0);
}

// Every finite fp16 value survives fp16 -> fp32 -> fp16 (and NaNs stay NaN with
// their sign).
TEST(HalfTest, Fp16RoundTripsExhaustively) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = Fp16ToFp32(static_cast<uint16_t>(h));
    const uint16_t back = Fp32ToFp16(f);
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0) {
      ASSERT_TRUE(std::isnan(f)) << h;
      ASSERT_EQ(back, h)
          << h;  // payload fits in 10 bits, so it is kept exactly
    } else {
      ASSERT_EQ(back, h) << std::hex << h;
    }
  }
}

TEST(HalfTest, HandCheckedEdgeCases) {
  EXPECT_EQ(Fp32ToFp16(0.0f), 0x0000);
  EXPECT_EQ(Fp32ToFp16(-0.0f), 0x8000);
  EXPECT_EQ(Fp32ToFp16(1.0f), 0x3c00);
  EXPECT_EQ(Fp32ToFp16(65504.0f), 0x7bff);
  EXPECT_EQ(Fp32ToFp16(65519.0f), 0x7bff);
  EXPECT_EQ(Fp32ToFp16(65520.0f), 0x7c00);  // tie rounds to even, which is inf
  EXPECT_EQ(Fp32ToFp16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(Fp32ToFp16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(Fp32ToFp16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(Fp32ToFp16(std::ldexp(1.0f, -25)), 0x0000);  // tie -> even (0)
  EXPECT_EQ(Fp32ToFp16(std::ldexp(3.0f, -25)),
            0x0002);  // 1.5 ulp tie -> even (2)
  EXPECT_EQ(Fp32ToFp16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(Fp32ToFp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie -> even
  EXPECT_EQ(Fp32ToFp16(1.0f + 3 * std::ldexp(1.0f, -11)),
            0x3c02);  // tie -> even (up)
  EXPECT_EQ(Fp32ToFp16(std::numeric_limits<float>::denorm_min()), 0x0000);
  const uint16_t nan16 = Fp32ToFp16(std::nanf(""));
  EXPECT_EQ(nan16 & 0x7c00, 0x7c00);
  EXPECT_NE(nan16 & 0x3ff, 0);
  EXPECT_EQ(Fp32ToFp16(F(0xff800001u)),
            0xfc01);  // payload vanishes -> kept non-zero

  EXPECT_EQ(Bits(Fp16ToFp32(0x0001)), Bits(std::ldexp(1.0f, -24)));
  EXPECT_EQ(Bits(Fp16ToFp32(0x83ff)), Bits(-std::ldexp(1023.0f, -24)));
  EXPECT_EQ(Fp16ToFp32(0x7bff), 65504.0f);
  EXPECT_TRUE(std::isinf(Fp16ToFp32(0xfc00)));
  EXPECT_EQ(Bits(Fp16ToFp32(0x7e01)), 0x7fc02000u);  // NaN payload kept

  EXPECT_EQ(Fp32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Fp32ToBf16(F(0x3f808000u)), 0x3f80);  // tie, even -> down
  EXPECT_EQ(Fp32ToBf16(F(0x3f818000u)), 0x3f82);  // tie, odd -> up
  EXPECT_EQ(Fp32ToBf16(F(0x7f7fffffu)), 0x7f80);  // max float rounds to inf
  EXPECT_EQ(Fp32ToBf16(F(0x7f800001u)),
            0x7fc0);  // signalling NaN -> quiet, not inf
  EXPECT_EQ(Fp32ToBf16(F(0xffa00000u)), 0xffe0);
  EXPECT_EQ(Fp32ToBf16(F(0x00000001u)),
            0x0000);  // fp32 denormal rounds to zero
  EXPECT_EQ(Fp32ToBf16(F(0x00018000u)),
            0x0002);  // bf16 denormal, tie odd -> up
  EXPECT_EQ(Bits(Bf16ToFp32(0x8001)), 0x80010000u);
}

TEST(HalfTest, BulkFormsMatchScalar) {
  const float in[5] = {0.1f, -2.5f, 1e-6f, 70000.0f, 3.14159f};
  uint16_t h[5], b[5];
  float back[5];
  Fp32ToFp16(in, h, 5);
  Fp32ToBf16(in, b, 5);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(h[i], Fp32ToFp16(in[i]));
    EXPECT_EQ(b[i], Fp32ToBf16(in[i]));
  }
  Fp16ToFp32(h, back, 5);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(Bits(back[i]), Bits(Fp16ToFp32(h[i])));
  Bf16ToFp32(b, back, 5);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(Bits(back[i]), Bits(Bf16ToFp32(b[i])));
}

}  // namespace
}  // namespace kvd::kernels
